"""``sibylla label``, ``sibylla trainer`` and ``sibylla models list|rollback|keygen``.

Registering imports nothing heavy (no torch, no Kafka client); the handlers do.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
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
        description="Sends an operator vote to a worker (POST /labels/JOB/ATTEMPT) with the "
                    "bearer token in SIBYLLA_OPERATOR_TOKEN; the worker holding the job "
                    "publishes the Label to sibylla.labels once the attempt's window is known.")
    p.add_argument("job_id")
    p.add_argument("attempt", type=int)
    p.add_argument("label", choices=["deterministic", "nondeterministic"])
    p.add_argument("--url", default=None,
                   help="a worker's HTTP address (default: http://WEB_HOST:WEB_PORT)")
    add_settings_arguments(p, only={"web_host", "web_port"})
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
    p = actions.add_parser(
        "keygen", help="make the trainer's Ed25519 key pair for signing announcements",
        description="Writes the private key to FILE (mode 0600; the trainer's "
                    "SIBYLLA_MODEL_SIGNING_KEY) and the public key to FILE.pub, and prints "
                    "the public key (the workers' SIBYLLA_MODEL_PUBLIC_KEY).")
    p.add_argument("file", type=Path, help="where to write the private key (must not exist)")
    p.set_defaults(func=_keygen)


def _online(args: argparse.Namespace) -> Any:
    from .settings import OnlineSettings

    return OnlineSettings.from_env(models_dir=args.models_dir)


def _label(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    settings = settings_from_args(args)
    from .settings import OnlineSettings

    token = OnlineSettings.from_env().operator_token
    if not token:
        print("sibylla label: no operator token: set SIBYLLA_OPERATOR_TOKEN", file=sys.stderr)
        return 2
    base = args.url or f"http://{settings.web_host}:{settings.web_port}"
    url = (f"{base.rstrip('/')}/labels/{urllib.parse.quote(args.job_id, safe='')}/"
           f"{args.attempt}")
    request = urllib.request.Request(
        url, data=json.dumps({"label": args.label}).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            queued = json.loads(resp.read())["queued"]
    except urllib.error.HTTPError as exc:
        print(f"sibylla label: {exc.code}: {_error_of(exc.read())}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(f"sibylla label: no worker at {base}: {exc.reason}", file=sys.stderr)
        return 1
    print(f"labeled {args.job_id} attempt {args.attempt} {args.label} as "
          f"{queued['operator']}")
    return 0


def _error_of(body: bytes) -> str:
    """The message of a worker's JSON error body (the body itself if it is not one)."""
    import json

    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


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
    from .service import announce, signing_key
    from .store import ModelStore

    online = _online(args)
    key = signing_key(online)  # a rollback is a new signed announcement, like a promotion
    store = ModelStore(online.models_dir)
    entry = store.set_current(args.version)
    asyncio.run(announce(settings_from_args(args), online, store, entry, key))
    print(f"current model is now {entry.version}; announced on sibylla.models")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from .signing import SigningKeyError, generate_key_pair

    try:
        public_path, public = generate_key_pair(args.file)
    except SigningKeyError as exc:
        print(f"sibylla models keygen: {exc}", file=sys.stderr)
        return 1
    print(f"private key: {args.file} (mode 0600; the trainer's SIBYLLA_MODEL_SIGNING_KEY)")
    print(f"public key:  {public_path}")
    print(f"SIBYLLA_MODEL_PUBLIC_KEY={public}")
    return 0
