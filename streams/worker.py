"""A Sibylla worker: the agents plus its HTTP pages, started as one process.

HTTP (faust's web server, on ``web_host:web_port``):
- ``GET /``: the status page (model, lag, last decisions, dead letters; ``status_page``);
- ``GET /ready``: 200 when the worker owns partitions with their tables recovered, else 503,
  with a JSON body saying why (``readiness``);
- ``GET /metrics``: Prometheus metrics;
- ``GET /decisions/{job_id}``: the latest decision for a job (404 when none); a worker that
  does not own the job's partition redirects to the one that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
from concurrent.futures import Future

import faust
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sibylla.collector import tune_collector
from sibylla.inference.api import Classifier
from sibylla.online_learning.worker import register as register_online_learning
from sibylla.settings import Settings
from sibylla.simulator.reliability import mttf_hours
from sibylla.streams.agents import Pipeline
from sibylla.streams.app import build_app
from sibylla.streams.fastpath import SibyllaApp
from sibylla.streams.readiness import Readiness
from sibylla.streams.status_page import render_status_page
from sibylla.streams.topics import broker_answers, ensure_topics, transient_broker_error

__all__ = ["build_worker", "next_restarts", "run_worker"]

log = logging.getLogger(__name__)

LAG_EVERY_S = 5.0
RELIABILITY_EVERY_S = 10.0
MTTF_JOB_NODES = (1, 16, 128, 1024, 2048)  # job sizes the MTTF gauge is projected for
# A worker whose faust crashed on the broker, which answers again by the time the worker looks
# (a blip shorter than faust's shutdown), starts again at once, but at most RESTART_LIMIT times
# within RESTART_WINDOW_S: a broker that answers at its bootstrap address while the address it
# advertises cannot be reached would otherwise have the worker start again forever. The times
# of these restarts travel to the next start in RESTARTS_ENV (exec keeps the environment).
RESTART_LIMIT = 3
RESTART_WINDOW_S = 120.0
RESTARTS_ENV = "SIBYLLA_WORKER_RESTARTS"


def _register_pages(pipeline: Pipeline) -> None:
    app, t = pipeline.t.app, pipeline.t
    readiness = Readiness(app, t.logs.get_topic_name(), pipeline.model_loaded)
    pipeline.metrics.ready.set_function(lambda: float(readiness.state().ready))

    @app.task
    async def time_ready_once_the_model_is_in() -> None:
        with contextlib.suppress(Exception):  # a model that fails stops the worker (_warm_up)
            await pipeline.model()
        readiness.time_if_ready()
    worker_name = f"{socket.gethostname()}:{pipeline.settings.web_port} (pid {os.getpid()})"

    @app.page("/")
    async def status(web: View, request: Request) -> Response:
        html = render_status_page(pipeline.activity, readiness.state(), worker_name)
        return web.html(html)

    @app.page("/ready")
    async def ready(web: View, request: Request) -> Response:
        state = readiness.state()
        return web.json(state.to_dict(), status=200 if state.ready else 503)

    @app.page("/metrics")
    async def metrics(web: View, request: Request) -> Response:
        body = generate_latest(pipeline.metrics.registry)
        return web.bytes(body, content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/decisions/{job_id}")
    @app.table_route(table=t.history, match_info="job_id")  # keyed and partitioned by job_id
    async def decision(web: View, request: Request, job_id: str) -> Response:
        value = pipeline.latest_decision(job_id)
        if value is None:
            return web.json({"error": f"no decision for job {job_id!r}"}, status=404)
        return web.bytes(value, content_type="application/json")


def _register_lag(pipeline: Pipeline) -> None:
    app, probe = pipeline.t.app, pipeline.offsets

    @app.timer(LAG_EVERY_S, name="consumer_lag")
    async def consumer_lag() -> None:
        try:
            lags = await probe.lag()
            for (topic, partition), lag in lags.items():
                pipeline.metrics.consumer_lag.labels(topic=topic, partition=str(partition)).set(lag)
            pipeline.activity.set_lag(lags)
        except Exception as exc:  # noqa: BLE001 - a metric must never stop the worker
            log.warning("consumer lag probe failed: %s", exc)


def _register_reliability(pipeline: Pipeline) -> None:
    @pipeline.t.app.timer(RELIABILITY_EVERY_S, name="reliability_metrics")
    async def reliability_metrics() -> None:
        estimator = pipeline.reliability
        rate = estimator.rate_per_node_day(time.time())[0]  # one interval per tick, not six
        if math.isnan(rate):
            return
        pipeline.metrics.failure_rate.set(rate)
        for nodes in MTTF_JOB_NODES:
            pipeline.metrics.mttf_seconds.labels(nodes=str(nodes)).set(3600.0 * mttf_hours(
                nodes * estimator.gpus_per_node, rate, estimator.gpus_per_node))


def load_in_background(settings: Settings, into: Future[Classifier]) -> None:
    """Load the configured model into ``into`` in a thread of its own, which waits while a
    process of the model's own starts and loads it (``inference/remote.py``: its forward
    passes then never wait for this process's interpreter lock). A model that cannot be
    loaded stops the worker once it is found out (``Pipeline._warm_up``)."""

    def load() -> None:
        if not into.set_running_or_notify_cancel():
            return
        try:
            from sibylla.inference.remote import ProcessClassifier

            into.set_result(ProcessClassifier(settings.model_path or None, settings.device,
                                              settings.min_confidence, settings.cpu_threads))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the model
            into.set_exception(exc)

    threading.Thread(target=load, name="sibylla-model-load", daemon=True).start()


def load_on_first_join(app: SibyllaApp, settings: Settings, into: Future[Classifier]) -> None:
    """Start :func:`load_in_background` as the worker's first group join begins.

    Loading the model (torch's import alone is ~2 s, a third of a second of it in one call
    that holds the GIL) slows whatever Python runs beside it. Started with the process, it
    held back faust's start and so the join; started at the join, it runs while the broker
    holds the join (Tansu 3 s, Apache Kafka ``group.initial.rebalance.delay.ms``) and the
    tables open: ~0.6-0.9 s sooner to the first decision on Tansu (docs/pipeline-bench.md,
    finding 10)."""
    begun = threading.Lock()

    def load_once() -> None:
        if begun.acquire(blocking=False):  # the first join only; never released
            load_in_background(settings, into)
    app.join_hooks.append(load_once)


def build_worker(settings: Settings, classifier: Classifier | Future[Classifier]) -> Pipeline:
    """The pipeline with every agent, timer and page registered (not running yet);
    ``classifier`` may still be loading."""
    pipeline = Pipeline(build_app(settings), classifier)
    pipeline.register()
    register_online_learning(pipeline)
    _register_pages(pipeline)
    _register_lag(pipeline)
    _register_reliability(pipeline)
    return pipeline


def next_restarts(history: str, now: float) -> str | None:
    """``history`` (:data:`RESTARTS_ENV`'s value: comma-separated ``time.time()`` stamps)
    with ``now`` added and stamps older than :data:`RESTART_WINDOW_S` dropped; None when the
    worker has started again :data:`RESTART_LIMIT` times within that window already."""
    recent = [stamp for stamp in (float(part) for part in history.split(",") if part)
              if now - stamp < RESTART_WINDOW_S]
    if len(recent) >= RESTART_LIMIT:
        return None
    return ",".join(f"{stamp:.3f}" for stamp in (*recent, now))


def _start_again_after_crash(settings: Settings, crash: BaseException | None) -> None:
    """Exec the worker anew (same PID, fresh state) when it crashed on the broker; return
    when that cannot help, for the crash to end the process.

    While the broker does not answer, the next start waits up to ``broker_wait_s`` for it in
    its topic check, as a supervisor would restart the worker. A broker that answers again
    after a crash on a transient broker error (faust's first connection refused during a blip)
    gets a start at once, within the restart budget."""
    if not asyncio.run(broker_answers(settings)):
        log.warning("the broker %s does not answer; starting again once it does",
                    settings.bootstrap_servers)
    elif crash is not None and transient_broker_error(crash):
        restarts = next_restarts(os.environ.get(RESTARTS_ENV, ""), time.time())
        if restarts is None:
            log.error("faust failed on the broker %s again (%r); not starting again: %d "
                      "restarts within %.0f s", settings.bootstrap_servers, crash,
                      RESTART_LIMIT, RESTART_WINDOW_S)
            return
        os.environ[RESTARTS_ENV] = restarts
        log.warning("faust failed on the broker %s (%r), which answers now; starting again "
                    "(restart %d of at most %d within %.0f s)", settings.bootstrap_servers,
                    crash, restarts.count(",") + 1, RESTART_LIMIT, RESTART_WINDOW_S)
    else:
        return
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def run_worker(settings: Settings, classifier: Classifier | None = None) -> int:
    """Run a worker until SIGINT/SIGTERM. Blocks.

    faust exits when its first connection fails, and the broker can go away between the topic
    check and that connection (seen in the fault campaign); once running, faust rides out a
    broker restart by itself. A worker that crashes so starts again in the same process
    (:func:`_start_again_after_crash`); one told to stop while it fails exits instead."""
    asyncio.run(ensure_topics(settings, settings.broker_wait_s))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    model: Classifier | Future[Classifier] = classifier if classifier is not None else Future()
    pipeline = build_worker(settings, model)
    if isinstance(model, Future):
        load_on_first_join(pipeline.t.app, settings, model)
    log.info("worker settings: %s", settings.redacted())
    tune_collector()
    worker = faust.Worker(pipeline.t.app, loglevel=settings.log_level.upper(), quiet=True,
                          redirect_stdouts=False, override_logging=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exit_:
        # A SIGTERM or SIGINT taken while faust stopped after the failure is an order to
        # stop: mode records its time, and the crash is re-raised over it. What failed is a
        # crash of a service (its reason), or an exception out of the start, which mode turns
        # into this exit while handling it (its context).
        if exit_.code and worker._signal_stop_time is None:
            _start_again_after_crash(settings, worker.crash_reason or exit_.__context__)
        raise
    return 0
