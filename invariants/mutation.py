"""Source-patch mutation testing of the organizations against the state machines.

A :class:`Mutant` is one plausible one-line bug: an exact piece of source text in one module
and its replacement. :func:`apply` compiles the patched module source on the side, finds every
function whose code changed and installs it (with the real module's globals, so classes and
constants stay the real ones) through ``monkeypatch``; the files on disk are never touched.
A target text that is missing or not unique raises :class:`MutantTargetGone`, so a refactor
that moves the code fails loudly instead of producing a silent equivalent.

A mutant is *killed* when any state machine it runs on fails (any exception: a model
assertion, an App. D.2 checker, an internal assertion or a crash). ``python -m
invariants.mutants`` runs the whole set (``invariants/mutants.py``) and prints the score and
the survivors. The machines record events and watch the pools; the organizations run the same
code with or without them, so a mutant patches the code that ships.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from invariants.stateful import GEOMETRIES, MACHINES, machine_for

# No shrinking: a kill needs one failing program.
MUTANT_SETTINGS = settings(max_examples=150, stateful_step_count=40, derandomize=True,
                           deadline=None, database=None, report_multiple_bugs=False,
                           phases=[Phase.explicit, Phase.generate],
                           suppress_health_check=list(HealthCheck))


class MutantTargetGone(RuntimeError):
    """The text a mutant replaces is not (exactly once) in its module any more."""


@dataclass(frozen=True)
class Mutant:
    name: str
    cluster: str  # which property it attacks (the survivor clusters and others)
    module: str  # dotted module name
    old: str  # exact source text, unique in the module
    new: str
    orgs: tuple[str, ...] = ("S0", "S1", "S2", "D0")
    geometry: str | None = None  # GEOMETRIES key (default: Falcon-H1-7B)
    equivalent: str = ""  # why no program can tell it apart (then it is not scored)


def _functions(ns: dict[str, Any], modname: str) -> Iterator[tuple[object, str, Any]]:
    """(owner, attribute, function) of every function and method defined in ``ns``."""
    for name, obj in ns.items():
        if isinstance(obj, types.FunctionType) and obj.__module__ == modname:
            yield ns, name, obj
        elif isinstance(obj, type) and obj.__module__ == modname:
            for attr, val in vars(obj).items():
                if isinstance(val, types.FunctionType):
                    yield obj, attr, val


def _code_key(code: types.CodeType) -> tuple[object, ...]:
    consts = tuple(_code_key(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames


def patched_functions(m: Mutant) -> list[tuple[object, str, Callable[..., Any]]]:
    """``(owner, attribute, replacement)`` for every function ``m`` changes."""
    mod = importlib.import_module(m.module)
    src = inspect.getsource(mod)
    n = src.count(m.old)
    if n != 1:
        raise MutantTargetGone(f"mutant {m.name}: its target occurs {n} times in {m.module} "
                               f"(expected once): {m.old!r}")
    scratch: dict[str, Any] = {"__name__": m.module}
    exec(compile(src.replace(m.old, m.new), f"<mutant {m.name}>", "exec"), scratch)  # noqa: S102
    classes = {name: obj for name, obj in vars(mod).items() if isinstance(obj, type)}
    out: list[tuple[object, str, Any]] = []
    for owner, attr, fn in _functions(scratch, m.module):
        if fn.__code__.co_filename != f"<mutant {m.name}>":
            continue  # generated (dataclass methods): never a mutation target
        real_owner: Any = mod if owner is scratch else classes[owner.__name__]  # type: ignore[attr-defined]
        old = vars(real_owner).get(attr)
        if isinstance(old, types.FunctionType) and \
                _code_key(old.__code__) == _code_key(fn.__code__):
            continue
        cells = tuple(types.CellType(real_owner) if name == "__class__" else
                      types.CellType(None) for name in fn.__code__.co_freevars)
        new = types.FunctionType(fn.__code__, vars(mod), fn.__name__, fn.__defaults__,
                                 cells or None)
        new.__kwdefaults__ = fn.__kwdefaults__
        out.append((real_owner, attr, new))
    for name, val in scratch.items():  # module constants (e.g. a threshold)
        if isinstance(val, (int, str)) and not name.startswith("__") \
                and getattr(mod, name, None) != val:
            out.append((mod, name, val))
    if not out:
        raise MutantTargetGone(f"mutant {m.name}: the patch changes no function of {m.module}")
    return out


@contextmanager
def applied(m: Mutant) -> Iterator[None]:
    """The mutant installed for the duration of the block (restored on exit)."""
    saved = []
    try:
        for owner, attr, new in patched_functions(m):
            saved.append((owner, attr, vars(owner)[attr]))
            setattr(owner, attr, new)
        yield
    finally:
        for owner, attr, val in reversed(saved):
            setattr(owner, attr, val)


@dataclass(frozen=True)
class MutantResult:
    mutant: Mutant
    killed_on: str | None  # organization whose machine failed first, or None
    error: str  # first line of the failure


def run_mutant(m: Mutant, run_settings: settings = MUTANT_SETTINGS) -> MutantResult:
    """Run ``m`` on each of its organizations until one machine fails. The organizations have
    one implementation of each operation (no compiled twin, no path chosen by a watcher or an
    observer), so the function a mutant patches is the one serving and simulation run."""
    with applied(m):
        for org in m.orgs:
            machine = MACHINES[org] if m.geometry is None else \
                machine_for(org, GEOMETRIES[m.geometry])
            try:
                run_state_machine_as_test(machine, settings=run_settings)
            except Exception as exc:  # noqa: BLE001 - any failure kills the mutant
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                return MutantResult(m, org, f"{type(exc).__name__}: {lines[0][:160]}")
    return MutantResult(m, None, "")
