"""The ``sibylla`` command: one entry point, subcommands contributed by each pipeline stage.

Each stage has a ``cli`` module with ``register(subparsers)``; registering must stay cheap
(no torch import) so that ``sibylla decisions --follow`` starts instantly. Heavy imports happen
inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from sibylla.settings import SettingsError

__all__ = ["main"]

# The stages that contribute subcommands, in the order of the data flow.
COMMAND_MODULES = (
    "sibylla.brokers.cli",
    "sibylla.streams.cli",
    "sibylla.inference.cli",
    "sibylla.online_learning.cli",
    "sibylla.simulator.cli",
    "sibylla.scheduler.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sibylla",
        description="Tells a GPU cluster's scheduler whether retrying a failed job can succeed.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"sibylla: bad setting: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
