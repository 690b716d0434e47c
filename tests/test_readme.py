"""The README's command lines are true: every ``hybridmem`` subcommand and flag it shows exists,
and the cheap concrete commands run with exit 0 and nothing on stderr (no vLLM log line).

The heavy ones (``run``, ``sim``, ``campaign``, ``serve``, ``continuation``, ``diagnose``) are run
by ``make demo`` and by their own tests; here their flags are checked against the parser, so a
renamed or removed flag fails the suite instead of a newcomer's first hour.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hybridmem.cli.main import COMMANDS, build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def command_lines(text: str) -> list[str]:
    """``hybridmem ...`` lines of the README's ``sh`` blocks, continuation lines joined."""
    out: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        ours = False  # the line above is a hybridmem line (or its continuation)
        for line in block.splitlines():
            code = line.split("  #")[0].rstrip()
            if code.startswith("hybridmem "):
                out.append(code.rstrip("\\"))
                ours = True
            elif ours and line.startswith(" ") and code.strip().startswith(("[", "--")):
                out[-1] += " " + code.strip().rstrip("\\")
            elif code.strip():
                ours = line.startswith(" ") and ours
    return out


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def parser_for(words: list[str]) -> tuple[str, argparse.ArgumentParser]:
    """The (sub)parser a README line addresses: ``hybridmem trace verify ...`` -> trace verify."""
    top = _subparsers(build_parser(words[0]))[words[0]]
    name, parser = words[0], top
    actions = _subparsers(top)
    if len(words) > 1 and words[1] in actions:
        name, parser = f"{words[0]} {words[1]}", actions[words[1]]
    return name, parser


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


LINES = command_lines(README.read_text())


def test_the_readme_shows_commands() -> None:
    assert len(LINES) >= 30


def missing_flags(line: str) -> list[str]:
    """The flags of a README line that its (sub)command does not define."""
    words = line.split()[1:]
    assert words[0] in COMMANDS, f"README names an unknown subcommand: {line}"
    _, parser = parser_for(words)
    flags = {f.split("=")[0] for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", line)}
    return sorted(f for f in flags if f not in options(parser))


@pytest.mark.parametrize("line", LINES, ids=[" ".join(x.split()[:3]) for x in LINES])
def test_every_subcommand_and_flag_exists(line: str) -> None:
    assert not missing_flags(line), f"README `{line[:70]}`: no {missing_flags(line)}"


def test_a_wrong_flag_is_caught() -> None:
    """Control: a renamed flag in a line of the same shape fails the check above."""
    fixture = "```sh\nhybridmem trace stats PATH [--jason]\n  [--json]\n```\n"
    (line,) = command_lines(fixture)
    assert missing_flags(line) == ["--jason"]


CONCRETE = [
    "hybridmem plan --model falcon-h1-7b --budget b63",
    "hybridmem plan --model falcon-h1-7b --budget b63 --attention-fraction 0.5 --json",
    "hybridmem plan --model nemotron-h-8b --total 8GiB --attention-fraction 0.2",
    "hybridmem storage --model falcon-h1-7b --attention 120 --recurrent 16",
    "hybridmem storage --model falcon-h1-7b --capacity 100MiB --mix 1,1",
    "hybridmem lineage views",
    "hybridmem stats two-look 0.01 0.03",
    "hybridmem stats holm 0.01 0.04 0.2",
]


def test_concrete_commands_are_readme_lines() -> None:
    """Each command run below is a README line with its optional parts filled in."""
    for cmd in CONCRETE:
        head = " ".join(cmd.split()[:4])
        assert any(line.startswith(head.rsplit(" ", 1)[0]) for line in LINES), cmd


@pytest.mark.parametrize("cmd", CONCRETE)
def test_concrete_commands_run_cleanly(cmd: str) -> None:
    exe = Path(sys.executable).with_name("hybridmem")
    r = subprocess.run([str(exe), *shlex.split(cmd)[1:]], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}: {r.stderr.strip()[:300]}"
    assert r.stderr.strip() == "", f"{cmd}: stderr {r.stderr.strip()[:300]}"
    assert r.stdout.strip()
