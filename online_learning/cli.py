"""``sibylla label``, ``sibylla trainer`` and ``sibylla models list|rollback``.

Registering imports nothing heavy (no torch, no Kafka client); the handlers do.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from sibylla.settings import CONNECTION, add_settings_arguments, settings_from_args

__all__ = ["register"]



def _models_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", default=None,
                        help="the trainer's models directory (default: SIBYLLA_MODELS_DIR or "
                             "sibylla-models)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "label", help="an operator's label for a failed attempt (outweighs every other vote)",
        description="Publishes an operator vote; the worker holding the job publishes the "
                    "Label to sibylla.labels once the attempt's window is known.")
    p.add_argument("job_id")
    p.add_argument("attempt", type=int)
    p.add_argument("label", choices=["deterministic", "nondeterministic"])
    add_settings_arguments(p, only=CONNECTION)
    p.set_defaults(func=_label)

    p = subparsers.add_parser(
        "trainer", help="run the trainer: labels in, gated fine-tuned models announced",
        description="Consumes sibylla.labels, fine-tunes after SIBYLLA_FINETUNE_EVERY new "
                    "labels or on drift, promotes a candidate only through the gate, writes it "
                    "to the models directory and announces it on sibylla.models.")
    _models_dir(p)
    add_settings_arguments(p, only=CONNECTION | {"partitions", "replication_factor",
                                                 "model_path", "log_level"})
    p.set_defaults(func=_trainer)

    models = subparsers.add_parser("models", help="inspect or roll back promoted models")
    actions = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    p = actions.add_parser("list", help="every candidate with its scores and gate result")
    _models_dir(p)
    p.set_defaults(func=_list)
    p = actions.add_parser("rollback", help="make a stored model current and announce it")
    p.add_argument("version")
    _models_dir(p)
    add_settings_arguments(p, only=CONNECTION)
    p.set_defaults(func=_rollback)


def _online(args: argparse.Namespace) -> Any:
    from .settings import OnlineSettings

    return OnlineSettings.from_env(models_dir=args.models_dir)


def _label(args: argparse.Namespace) -> int:
    from aiokafka import AIOKafkaProducer

    from .votes import operator_request

    settings = settings_from_args(args)
    value = operator_request(args.job_id, args.attempt, args.label)

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                    **settings.kafka_client_options())
        await producer.start()
        try:
            await producer.send_and_wait(settings.topic("label-votes"),
                                         key=args.job_id.encode(), value=value)
        finally:
            await producer.stop()

    asyncio.run(send())
    print(f"labeled {args.job_id} attempt {args.attempt} {args.label}")
    return 0


def _trainer(args: argparse.Namespace) -> int:
    from .service import run_trainer

    asyncio.run(run_trainer(settings_from_args(args), _online(args)))
    return 0


def _list(args: argparse.Namespace) -> int:
    from .store import ModelStore

    store = ModelStore(_online(args).models_dir)
    current = store.current
    print(f"{'':1} {'version':<22} {'status':<9} {'parent':<22} {'created':<19} "
          f"{'real acc':>8} {'recent acc':>10} {'det prec':>8}")
    for e in store.entries():
        cand = e.scores.get("candidate", {})
        real, recent = cand.get("real", {}), cand.get("recent", {})
        mark = "*" if current is not None and e.version == current.version else ""
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.created_at))
        print(f"{mark:1} {e.version:<22} {e.status:<9} {e.parent or '-':<22} {created:<19} "
              f"{_num(real.get('accuracy')):>8} {_num(recent.get('accuracy')):>10} "
              f"{_num(real.get('det_precision')):>8}")
        for reason in e.reasons:
            print(f"    rejected: {reason}")
    return 0


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _rollback(args: argparse.Namespace) -> int:
    from .service import announce
    from .store import ModelStore

    online = _online(args)
    store = ModelStore(online.models_dir)
    entry = store.set_current(args.version)
    asyncio.run(announce(settings_from_args(args), online, store, entry))
    print(f"current model is now {entry.version}; announced on sibylla.models")
    return 0
