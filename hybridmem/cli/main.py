"""Entry point of the ``hybridmem`` console script.

Every subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Caller errors
(:class:`hybridmem.errors.HybridMemError`, bad flags) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from hybridmem.errors import HybridMemError

# name -> module path; a module is imported only when its command runs (heavy deps stay lazy).
COMMANDS: dict[str, str] = {
    "plan": "hybridmem.cli.plan",
    "storage": "hybridmem.cli.storage",
    "demo": "hybridmem.cli.demo",
    "stats": "hybridmem.cli.stats",
    "fidelity": "hybridmem.cli.fidelity",
    "trace": "hybridmem.cli.trace",
    "lineage": "hybridmem.cli.lineage",
    "model": "hybridmem.cli.model",
    "run": "hybridmem.cli.run",
    "sim": "hybridmem.cli.sim",
    "campaign": "hybridmem.cli.campaign",
}

USAGE_EXIT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hybridmem",
        description="Memory organization for hybrid attention-SSM LLM serving.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module_path in COMMANDS.values():
        importlib.import_module(module_path).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
    except HybridMemError as exc:
        print(f"hybridmem {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except OSError as exc:  # a path the caller named cannot be read or written
        if isinstance(exc, BrokenPipeError):
            return 0
        print(f"hybridmem {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except KeyboardInterrupt:
        print(f"hybridmem {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
