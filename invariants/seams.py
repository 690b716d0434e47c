"""Mutants anchored on behaviour: a named function plus an operator, never a line of text.

A :class:`SeamMutant` is one plausible bug, named for the behaviour it breaks
("adopted-blocks-zeroed"), applied at a :class:`Seam`: a module and the qualified name of a
function or method in it (``"OrgKVCacheManager._admit"``). What changes is one of

* an **AST operator** (:class:`Op` subclasses) inside that function, identified by its kind and
  what it touches -- the names and constants it reads, the call it sits in, the variable it
  assigns, the test or loop it is in -- never by line number or source text. Expressions
  (conditions, arithmetic, calls, arguments: :class:`FlipCompare`, :class:`ReplaceConst`,
  :class:`ReplaceName`, :class:`ReplaceArg`, :class:`SwapArgs`, :class:`SwapOperands`,
  :class:`Negate`, :class:`AlwaysTrue`, :class:`SwapBoolOp`, :class:`Unslice`,
  :class:`Reverse`) and statements (:class:`DropCall`, :class:`DropAssign`,
  :class:`GuardCall`, :class:`MoveCall`, :class:`SwapJump`, :class:`InsertFirst`);
  :class:`Chain` applies several. The function's source is parsed, the
  operator rewrites the matching nodes, and the function is recompiled with the module's own
  globals (so classes and constants stay the real ones);
* a **wrapper** (:class:`Wrap`) around the function: change its result or arguments, skip it,
  or replace it.

A seam that no longer exists, or an operator that matches nothing (or, unless it says
``every=True``, more than one site), raises :class:`SeamGone` when the mutant is built, so a
refactor that moves the code fails loudly instead of scoring a silent equivalent.

:func:`applied` installs the mutant with ``setattr`` for the duration of a block and restores
everything after; besides the seam's owner it rebinds every loaded module attribute that held
the original function (``from m import f`` copies), so the code that runs is the mutant
wherever it was imported. Files on disk are never touched.

The same mutant runs under pytest through :mod:`invariants.seam_plugin` (the environment
variable ``HYBRIDMEM_SEAM_MUTANT`` names it; the plugin installs it before collection, so the
tests exercise exactly the code installed here); :mod:`invariants.serving_mutants` holds the
serving path's set and scores it, :mod:`invariants.mutants` the memory core's (run on the state
machines). This is the one mutation engine: nothing patches source text.

Examples::

    SeamMutant("adopted-blocks-zeroed", "kv-manager",
               Seam("hybridmem.vllm_plugin.org_manager", "OrgKVCacheManager._admit"),
               Unslice("attn", in_call="extend"),
               "the adopter's cached attention blocks are queued for zeroing with its new ones")
    SeamMutant("state-table-keeps-dropped-mapping", "state-table",
               Seam("hybridmem.vllm_plugin.state_table", "StateTable.drop"), skip(),
               "a dropped block id still resolves to its old address")
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar


class SeamGone(RuntimeError):
    """A mutant's seam (function) or operator site is not where the mutant says any more."""


# == seams =======================================================================================
@dataclass(frozen=True)
class Seam:
    """A function or method: ``module`` (dotted) and ``qualname`` (``Class.method`` or
    ``function``; properties, static and class methods included)."""

    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"

    def resolve(self) -> tuple[Any, str, Any, Callable[..., Any]]:
        """``(owner, attribute, raw attribute, function)``; :class:`SeamGone` if missing."""
        try:
            owner: Any = importlib.import_module(self.module)
        except ImportError as exc:
            raise SeamGone(f"seam {self}: module not importable ({exc})") from None
        *path, attr = self.qualname.split(".")
        for part in path:
            owner = vars(owner).get(part) if isinstance(owner, type) else getattr(owner, part,
                                                                                  None)
            if not isinstance(owner, type):
                raise SeamGone(f"seam {self}: no class {part!r} on the way to {attr!r}")
        raw = vars(owner).get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        fn = raw.fget if isinstance(raw, property) else \
            raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if callable(fn) and isinstance(getattr(fn, "__wrapped__", None), types.FunctionType):
            return owner, attr, raw, fn  # a decorated function (functools.cache, wraps)
        if not isinstance(fn, types.FunctionType):
            raise SeamGone(f"seam {self}: no function {attr!r} there (found {type(raw).__name__})")
        return owner, attr, raw, fn


def _rewrap(raw: Any, fn: Callable[..., Any]) -> Any:
    """``fn`` dressed as ``raw`` was (property, staticmethod, classmethod or plain)."""
    if isinstance(raw, property):
        return property(fn, raw.fset, raw.fdel, raw.__doc__)
    if isinstance(raw, staticmethod):
        return staticmethod(fn)
    if isinstance(raw, classmethod):
        return classmethod(fn)
    return fn


# == AST operators ===============================================================================
def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _call_name(node: ast.Call) -> str | None:
    """The called function's last name: ``f`` for ``f(...)`` and ``x.y.f(...)``."""
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _mentions(node: ast.AST, name: str) -> bool:
    """Whether ``node`` reads ``name`` (a variable, an attribute chain such as ``self.x``, an
    attribute name, or a called function's name)."""
    for sub in ast.walk(node):
        d = _dotted(sub)
        if d is not None and (d == name or d.endswith("." + name)):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == name:
            return True
    return False


@dataclass(frozen=True)
class Op:
    """An AST operator. ``in_call``: only sites inside a call of that function name;
    ``in_assign``: only sites inside a statement that assigns (or augments) that name;
    ``in_test``: only sites inside the test of an ``if`` or ``while``; ``in_for``: only sites
    inside a ``for`` loop whose iterable reads that name; ``every``: rewrite every matching
    site (default: exactly one must match)."""

    in_call: str | None = field(default=None, kw_only=True)
    in_assign: str | None = field(default=None, kw_only=True)
    in_test: bool = field(default=False, kw_only=True)
    in_for: str | None = field(default=None, kw_only=True)
    every: bool = field(default=False, kw_only=True)
    kind: ClassVar[str] = "op"

    def describe(self) -> str:
        fields = {k: v for k, v in vars(self).items() if v not in (None, False)}
        return f"{self.kind}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    # subclasses: is ``node`` a site, and what replaces it (None: delete a statement)
    def matches(self, node: ast.AST) -> bool:
        raise NotImplementedError

    def rewrite(self, node: ast.AST) -> ast.AST | None:
        raise NotImplementedError


def _expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


@dataclass(frozen=True)
class FlipCompare(Op):
    """Comparison operator ``old`` -> ``new`` (``"<="`` -> ``"<"``) in a comparison that reads
    ``touches`` (any, when empty)."""

    old: str
    new: str
    touches: str = ""
    kind: ClassVar[str] = "flip-compare"
    _OPS: ClassVar[dict[str, type]] = {"<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE,
                                       "==": ast.Eq, "!=": ast.NotEq, "in": ast.In,
                                       "not in": ast.NotIn, "is": ast.Is, "is not": ast.IsNot}

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Compare) and \
            any(isinstance(o, self._OPS[self.old]) for o in node.ops) and \
            (not self.touches or _mentions(node, self.touches))

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.Compare)
        node.ops = [self._OPS[self.new]() if isinstance(o, self._OPS[self.old]) else o
                    for o in node.ops]
        return node


@dataclass(frozen=True)
class ReplaceConst(Op):
    """A literal ``old`` (int, float, str; negative numbers included) -> ``new``."""

    old: object
    new: object
    kind: ClassVar[str] = "replace-const"

    def _value(self, node: ast.AST) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
                isinstance(node.operand, ast.Constant) and \
                isinstance(node.operand.value, (int, float)):
            return -node.operand.value
        return _NOTHING

    def matches(self, node: ast.AST) -> bool:
        v = self._value(node)
        return v is not _NOTHING and type(v) is type(self.old) and v == self.old and \
            not getattr(node, "_hm_negated", False)

    def rewrite(self, node: ast.AST) -> ast.AST:
        return _expr(repr(self.new))


_NOTHING = object()


@dataclass(frozen=True)
class ReplaceName(Op):
    """Every read of ``name`` (a variable or an attribute chain such as ``self._grid``) ->
    the expression ``new`` (``"0"``, ``"total"``, ``"end + 1"``)."""

    name: str
    new: str
    kind: ClassVar[str] = "replace-name"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, (ast.Name, ast.Attribute)) and \
            isinstance(getattr(node, "ctx", None), ast.Load) and _dotted(node) == self.name

    def rewrite(self, node: ast.AST) -> ast.AST:
        return _expr(self.new)


@dataclass(frozen=True)
class DropCall(Op):
    """A statement that is a call of ``func`` (``x.func(...)`` or ``func(...)``) is skipped;
    ``touches``: only a call that reads that name too."""

    func: str
    touches: str = ""
    kind: ClassVar[str] = "drop-call"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
            _call_name(node.value) == self.func and \
            (not self.touches or _mentions(node.value, self.touches))

    def rewrite(self, node: ast.AST) -> ast.AST | None:
        return None


@dataclass(frozen=True)
class DropAssign(Op):
    """An assignment (or ``del``) statement to ``target`` is skipped: a name or attribute
    chain (``"total"``, ``"self.x"``), or ``"x[]"`` for a store into (or deletion of) an item
    of ``x`` (``x[i]``, ``x[i][j]``). In a chained assignment (``a = b = v``) only that target
    is dropped."""

    target: str
    kind: ClassVar[str] = "drop-assign"

    def _hit(self, t: ast.AST) -> bool:
        if self.target.endswith("[]"):
            if not isinstance(t, ast.Subscript):
                return False
            while isinstance(t, ast.Subscript):
                t = t.value
            return _dotted(t) == self.target[:-2]
        return _dotted(t) == self.target

    def _targets(self, node: ast.AST) -> list[ast.expr]:
        if isinstance(node, (ast.Assign, ast.Delete)):
            return node.targets
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            return [node.target]
        return []

    def matches(self, node: ast.AST) -> bool:
        return any(self._hit(t) for t in self._targets(node))

    def rewrite(self, node: ast.AST) -> ast.AST | None:
        if isinstance(node, ast.Assign) and len(node.targets) > 1:
            node.targets = [t for t in node.targets if not self._hit(t)]
            return node if node.targets else None
        return None


@dataclass(frozen=True)
class ReplaceArg(Op):
    """Argument ``index`` (an int) or keyword ``index`` (a str) of calls of ``func`` ->
    ``new`` (an expression), or dropped when ``new`` is None; ``touches``: only a call that
    reads that name too."""

    func: str
    index: int | str
    new: str | None
    touches: str = ""
    kind: ClassVar[str] = "replace-arg"

    def matches(self, node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and _call_name(node) == self.func) or \
                (self.touches and not _mentions(node, self.touches)):
            return False
        if isinstance(self.index, int):
            return len(node.args) > self.index
        return any(k.arg == self.index for k in node.keywords)

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.Call)
        if isinstance(self.index, int):
            if self.new is None:
                del node.args[self.index]
            else:
                node.args[self.index] = _expr(self.new)
        elif self.new is None:
            node.keywords = [k for k in node.keywords if k.arg != self.index]
        else:
            node.keywords = [ast.keyword(k.arg, _expr(self.new)) if k.arg == self.index else k
                             for k in node.keywords]
        return node


@dataclass(frozen=True)
class SwapArgs(Op):
    """Positional arguments ``i`` and ``j`` of calls of ``func`` swapped."""

    func: str
    i: int = 0
    j: int = 1
    kind: ClassVar[str] = "swap-args"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and _call_name(node) == self.func and \
            len(node.args) > max(self.i, self.j)

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.Call)
        node.args[self.i], node.args[self.j] = node.args[self.j], node.args[self.i]
        return node


@dataclass(frozen=True)
class SwapOperands(Op):
    """``a - b`` -> ``b - a`` (``op``: ``"-"``, ``"/"``, ``"//"``, ``"+"`` for a
    concatenation) where it reads ``touches``."""

    op: str = "-"
    touches: str = ""
    kind: ClassVar[str] = "swap-operands"
    _OPS: ClassVar[dict[str, type]] = {"-": ast.Sub, "/": ast.Div, "//": ast.FloorDiv,
                                       "+": ast.Add}

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.BinOp) and isinstance(node.op, self._OPS[self.op]) and \
            (not self.touches or _mentions(node, self.touches))

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.BinOp)
        node.left, node.right = node.right, node.left
        return node


@dataclass(frozen=True)
class Negate(Op):
    """The test of an ``if`` / ``while`` / conditional expression / comprehension filter that
    reads ``touches`` is negated."""

    touches: str
    kind: ClassVar[str] = "negate"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, (ast.If, ast.While, ast.IfExp)) and \
            _mentions(node.test, self.touches)

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, (ast.If, ast.While, ast.IfExp))
        node.test = ast.UnaryOp(ast.Not(), node.test)
        return node


@dataclass(frozen=True)
class AlwaysTrue(Op):
    """A condition that reads ``touches`` -- the test of an ``if`` / ``while`` / conditional
    expression / ``assert`` / comprehension filter, or an operand of ``and`` / ``or`` (a
    comparison, a call, a name, an attribute or an item) -- is replaced by ``value`` (``True``:
    a check dropped from a conjunction; ``False``: from a disjunction). ``compare``: only a
    comparison with that operator (``"is"``)."""

    touches: str
    value: bool = True
    compare: str = ""
    kind: ClassVar[str] = "always"

    def matches(self, node: ast.AST) -> bool:
        if self.compare and not (isinstance(node, ast.Compare) and any(
                isinstance(o, FlipCompare._OPS[self.compare]) for o in node.ops)):
            return False
        return getattr(node, "_hm_in_test", False) and _mentions(node, self.touches)

    def rewrite(self, node: ast.AST) -> ast.AST:
        return ast.Constant(self.value)


@dataclass(frozen=True)
class SwapBoolOp(Op):
    """``and`` <-> ``or`` in a boolean operation that reads ``touches``."""

    touches: str = ""
    kind: ClassVar[str] = "swap-boolop"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.BoolOp) and \
            (not self.touches or _mentions(node, self.touches))

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return node


@dataclass(frozen=True)
class Unslice(Op):
    """``of[...]`` -> ``of``: the whole sequence where a part was meant."""

    of: str
    kind: ClassVar[str] = "unslice"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
            _dotted(node.value) == self.of

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.Subscript)
        return node.value


@dataclass(frozen=True)
class SwapJump(Op):
    """An ``if`` that reads ``touches`` and ends in ``continue`` ends in ``break`` instead (or
    the other way round): a loop that should skip an item stops at it."""

    touches: str
    kind: ClassVar[str] = "swap-jump"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.If) and _mentions(node.test, self.touches) and \
            isinstance(node.body[-1], (ast.Continue, ast.Break))

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.If)
        node.body[-1] = ast.Break() if isinstance(node.body[-1], ast.Continue) else \
            ast.Continue()
        return node


@dataclass(frozen=True)
class Reverse(Op):
    """Argument ``index`` of calls of ``func`` is passed in reverse order."""

    func: str
    index: int = 0
    kind: ClassVar[str] = "reverse"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and _call_name(node) == self.func and \
            len(node.args) > self.index

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.Call)
        node.args[self.index] = ast.Subscript(
            ast.Call(ast.Name("list", ast.Load()), [node.args[self.index]], []),
            ast.Slice(None, None, ast.UnaryOp(ast.USub(), ast.Constant(1))), ast.Load())
        return node


@dataclass(frozen=True)
class InsertFirst(Op):
    """A store ``of[k] = v`` into an ordered dict puts ``k`` at its oldest end instead of its
    newest (``move_to_end(k, last=False)`` after it)."""

    of: str
    kind: ClassVar[str] = "insert-first"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Assign) and len(node.targets) == 1 and \
            isinstance(node.targets[0], ast.Subscript) and \
            _dotted(node.targets[0].value) == self.of

    def rewrite(self, node: ast.AST) -> Any:
        assert isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
        move = ast.Call(ast.Attribute(_expr(self.of), "move_to_end", ast.Load()),
                        [node.targets[0].slice], [ast.keyword("last", ast.Constant(False))])
        return [node, ast.Expr(move)]


@dataclass(frozen=True)
class GuardCall(Op):
    """A statement that is a call of ``func`` runs only when ``when`` (an expression) holds."""

    func: str
    when: str
    kind: ClassVar[str] = "guard-call"

    def matches(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
            _call_name(node.value) == self.func

    def rewrite(self, node: ast.AST) -> ast.AST:
        assert isinstance(node, ast.Expr)
        return ast.If(_expr(self.when), [node], [])


@dataclass(frozen=True)
class MoveCall(Op):
    """A statement that is a call of ``func`` (reading ``touches``) moves up, to just before
    the first statement of the same block that reads ``before``: a step taken too early."""

    func: str
    before: str
    touches: str = ""
    kind: ClassVar[str] = "move-call"

    def _is_call(self, stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
            _call_name(stmt.value) == self.func and \
            (not self.touches or _mentions(stmt.value, self.touches))

    def apply(self, fdef: ast.AST) -> int:
        """Move the call in every block of ``fdef`` that has one; the number of moves."""
        sites = 0
        for node in ast.walk(fdef):
            for name in ("body", "orelse", "finalbody"):
                stmts = getattr(node, name, None)
                if not isinstance(stmts, list):
                    continue
                calls = [i for i, s in enumerate(stmts) if self._is_call(s)]
                if len(calls) != 1:
                    continue
                i = calls[0]
                j = next((k for k in range(i) if _mentions(stmts[k], self.before)), None)
                if j is not None:
                    stmts.insert(j, stmts.pop(i))
                    sites += 1
        return sites


@dataclass(frozen=True)
class Chain(Op):
    """Several operators applied in turn (each must match as it says): a bug that is one
    change of meaning but two of syntax (``== 0`` -> ``<= 1``)."""

    ops: tuple[Op, ...]
    kind: ClassVar[str] = "chain"

    def describe(self) -> str:
        return " + ".join(o.describe() for o in self.ops)


def _mark_tests(tree: ast.AST) -> None:
    """Flag the conditions and the operands of boolean operations (for :class:`AlwaysTrue`),
    every node of an ``if`` / ``while`` test (for ``in_test``), and the operands of unary
    minus (for :class:`ReplaceConst`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            setattr(node.operand, "_hm_negated", True)  # noqa: B010 (-1 is one literal)
        tests: list[ast.AST] = []
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            tests.append(node.test)
        elif isinstance(node, ast.BoolOp):
            tests.extend(node.values)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        for t in tests:
            if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
                t = t.operand
            if not isinstance(t, ast.BoolOp):  # (its operands are marked on their own)
                setattr(t, "_hm_in_test", True)  # noqa: B010 (a mark on a foreign node)
        if isinstance(node, (ast.If, ast.While)):
            for sub in ast.walk(node.test):
                setattr(sub, "_hm_under_test", True)  # noqa: B010 (for Op.in_test)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, op: Op) -> None:
        self.op = op
        self.sites = 0
        self._call: list[str | None] = []
        self._assign: list[set[str]] = []
        self._for: list[ast.expr] = []

    def _scoped(self, node: ast.AST) -> bool:
        if self.op.in_call is not None and self.op.in_call not in self._call:
            return False
        if self.op.in_test and not getattr(node, "_hm_under_test", False):
            return False
        if self.op.in_for is not None and \
                not any(_mentions(it, self.op.in_for) for it in self._for):
            return False
        return self.op.in_assign is None or any(self.op.in_assign in s for s in self._assign)

    def visit(self, node: ast.AST) -> Any:
        pushed_for = isinstance(node, ast.For)
        if pushed_for:
            self._for.append(node.iter)  # type: ignore[attr-defined]
        pushed_call = isinstance(node, ast.Call)
        pushed_assign = isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        if pushed_call:
            self._call.append(_call_name(node))  # type: ignore[arg-type]
        if pushed_assign:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target]  # type: ignore[attr-defined]
            names = {n for t in targets for sub in ast.walk(t)
                     if (n := _dotted(sub)) is not None}
            self._assign.append(names)
        try:
            node = self.generic_visit(node)  # children first: a rewritten node is not revisited
            if self.op.matches(node) and self._scoped(node):
                self.sites += 1
                new = self.op.rewrite(node)
                return ast.Pass() if new is None else new
            return node
        finally:
            if pushed_for:
                self._for.pop()
            if pushed_call:
                self._call.pop()
            if pushed_assign:
                self._assign.pop()


def _apply(op: Op, fdef: ast.FunctionDef | ast.AsyncFunctionDef, seam: Seam, label: str) -> None:
    """Rewrite ``fdef`` in place; :class:`SeamGone` unless ``op`` matched as it says."""
    if isinstance(op, MoveCall):
        sites = op.apply(fdef)
    else:
        _mark_tests(fdef)
        rw = _Rewriter(op)
        body: list[ast.stmt] = []
        for s in fdef.body:
            new = rw.visit(s)
            body.extend(new if isinstance(new, list) else [new])
        fdef.body = body
        sites = rw.sites
    if sites == 0 or (sites > 1 and not op.every):
        raise SeamGone(f"mutant {label}: {op.describe()} matches {sites} sites in {seam} "
                       "(expected exactly one; every=True for all)")


def mutated_source(m: SeamMutant) -> str:
    """The source of the seam's function as ``m``'s operator rewrites it (for review; a
    wrapper has none)."""
    if not isinstance(m.change, Op):
        raise TypeError(f"mutant {m.name} is a wrapper: no rewritten source")
    return ast.unparse(_mutated_def(m.seam, m.change, m.name)[0])


def _mutated_def(seam: Seam, op: Op, label: str) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef,
                                                          Any, Callable[..., Any]]:
    """The seam's function definition with ``op`` applied, its owner and the function."""
    owner, _attr, _raw, fn = seam.resolve()
    fn = inspect.unwrap(fn)  # a cached function is recompiled without its cache
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise SeamGone(f"seam {seam}: no source ({exc})") from None
    tree = ast.parse(src)
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise SeamGone(f"seam {seam}: its source is not a function definition")
    fdef.decorator_list = []  # re-dressed by _rewrap (property, staticmethod, ...)
    for one in op.ops if isinstance(op, Chain) else (op,):
        _apply(one, fdef, seam, label)
    ast.increment_lineno(fdef, fn.__code__.co_firstlineno - 1)
    return fdef, owner, fn


def _recompiled(seam: Seam, op: Op, label: str) -> Callable[..., Any]:
    """The seam's function with ``op`` applied, compiled against the module's globals."""
    fdef, owner, fn = _mutated_def(seam, op, label)
    # compile inside a class when the function is a method, so ``super()`` / ``__class__``
    # get their cell; the cell is then pointed at the real class
    module = ast.Module(body=[ast.ClassDef("_Seam", [], [], [fdef], [])]
                        if isinstance(owner, type) else [fdef], type_ignores=[])
    ast.fix_missing_locations(module)
    scratch: dict[str, Any] = dict(fn.__globals__)  # default values read module names
    with warnings.catch_warnings():  # a mutant may be odd code (None[r]): it is not run
        warnings.simplefilter("ignore", SyntaxWarning)
        code = compile(module, f"<mutant {label}>", "exec")
    exec(code, scratch)  # noqa: S102
    made = vars(scratch["_Seam"])[fdef.name] if isinstance(owner, type) else scratch[fdef.name]
    if isinstance(made, (staticmethod, classmethod)):
        made = made.__func__
    cells = tuple(types.CellType(owner) if name == "__class__" else
                  fn.__closure__[fn.__code__.co_freevars.index(name)]
                  if fn.__closure__ and name in fn.__code__.co_freevars else
                  types.CellType(None) for name in made.__code__.co_freevars)
    new = types.FunctionType(made.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                             cells or None)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new


# == wrappers ====================================================================================
@dataclass(frozen=True)
class Wrap:
    """The seam's function replaced by ``make(original)``; ``what`` says what it does."""

    what: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    kind: ClassVar[str] = "wrap"

    def describe(self) -> str:
        return f"wrap({self.what})"


def skip(returning: Any = None) -> Wrap:
    """The call does nothing and returns ``returning``."""
    return Wrap(f"skip, return {returning!r}", lambda _orig: lambda *a, **k: returning)


def returns(change: Callable[..., Any], what: str) -> Wrap:
    """The result replaced by ``change(result, *args, **kwargs)``."""
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(*a: Any, **k: Any) -> Any:
            return change(orig(*a, **k), *a, **k)
        return wrapper
    return Wrap(what, make)


def replaced(fn: Callable[..., Any], what: str) -> Wrap:
    """The function replaced by ``fn`` (which does not call the original)."""
    return Wrap(what, lambda _orig: fn)


# == mutants =====================================================================================
@dataclass(frozen=True)
class SeamMutant:
    """One plausible bug: ``name`` says the behaviour it breaks, ``why`` why it is plausible;
    ``tests`` the fast test files (or node ids) that must kill it; ``equivalent`` (when set)
    why no test can tell it apart, and then it is run but not scored."""

    name: str
    cluster: str
    seam: Seam
    change: Op | Wrap
    why: str
    tests: tuple[str, ...] = ()
    equivalent: str = ""

    def describe(self) -> str:
        return f"{self.name}: {self.change.describe()} at {self.seam}"

    def replacement(self) -> tuple[Any, str, Any, Any]:
        """``(owner, attribute, original raw attribute, replacement raw attribute)``."""
        owner, attr, raw, fn = self.seam.resolve()
        if isinstance(self.change, Wrap):
            new = self.change.make(fn)
        else:
            new = _recompiled(self.seam, self.change, self.name)
        return owner, attr, raw, _rewrap(raw, new)


def _aliases(original: Any) -> list[tuple[Any, str]]:
    """Module attributes that hold ``original`` (``from m import f`` copies)."""
    out = []
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            if v is original:
                out.append((mod, k))
    return out


def install(m: SeamMutant) -> Callable[[], None]:
    """Install ``m``; returns the function that restores the original."""
    owner, attr, raw, new = m.replacement()
    targets = [(owner, attr)]
    if not isinstance(owner, type):  # a module function: its imported copies too
        targets += [(mod, k) for mod, k in _aliases(raw) if (mod, k) != (owner, attr)]
    saved = [(o, a, o.__dict__[a] if isinstance(o, type) else getattr(o, a)) for o, a in targets]
    for o, a in targets:
        setattr(o, a, new)

    def restore() -> None:
        for o, a, v in saved:
            setattr(o, a, v)
        if not isinstance(owner, type):  # copies taken while it was installed
            for mod, k in _aliases(new):
                setattr(mod, k, raw)

    return restore


@contextmanager
def applied(m: SeamMutant) -> Iterator[None]:
    """``m`` installed for the duration of the block (restored on exit)."""
    restore = install(m)
    try:
        yield
    finally:
        restore()
