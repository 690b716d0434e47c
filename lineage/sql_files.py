"""The lineage SQL files: ``lineage/sql/*.sql`` (one view each, ``_params`` the one parameter
table), the SQL sets, and the order views are created in (each after the names it mentions).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SQL_DIR = Path(__file__).with_name("sql")
PARAMS = "_params"
EVENTS = "events"

# The SQL sets: ``current`` (lineage/sql, what every report uses) and ``reference``
# (lineage/sql/reference: the first, ASOF-join formulation of the views the rewrite changed,
# frozen; every other view is the current file). Kept as an executable second opinion that tests
# and ``benchmarks/ab_lineage_sql.py`` compare with.
SQL_SETS = {"current": SQL_DIR, "reference": SQL_DIR / "reference"}


def _sql_path(name: str, sql: str) -> Path:
    if sql not in SQL_SETS:
        raise ValueError(f"no lineage SQL set {sql!r}; have {sorted(SQL_SETS)}")
    own = SQL_SETS[sql] / f"{name}.sql"
    return own if own.exists() else SQL_DIR / f"{name}.sql"


@cache
def sql_names(sql: str = "current") -> tuple[str, ...]:
    """Every SQL name (file name without ``.sql``) of the set ``sql``, sorted: the current
    set's names (a set other than ``current`` overrides some of their files)."""
    if sql not in SQL_SETS:
        raise ValueError(f"no lineage SQL set {sql!r}; have {sorted(SQL_SETS)}")
    return tuple(sorted(p.stem for p in SQL_DIR.glob("*.sql")))


@cache
def load_sql(name: str, sql: str = "current") -> str:
    """The text of ``lineage/sql/<name>.sql`` (or of the ``sql`` set's own file)."""
    if name not in sql_names(sql):
        raise KeyError(f"no lineage SQL named {name!r}; have {list(sql_names(sql))}")
    return _sql_path(name, sql).read_text()


def _references(name: str, sql: str) -> set[str]:
    """Other SQL names the file mentions as whole words (its dependencies)."""
    body = load_sql(name, sql)
    body = "\n".join(line.split("--", 1)[0] for line in body.splitlines())  # drop comments
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", body))
    return {n for n in sql_names(sql) if n != name and n in words}


@cache
def creation_order(sql: str = "current", only: frozenset[str] | None = None
                   ) -> tuple[str, ...]:
    """SQL names in dependency order (``_params`` first); a cycle is a bug in the SQL. Private
    names that no public view of the set needs are left out (a set other than ``current`` may
    not use every building block of the current one). ``only``: just those names and what
    they read (see :func:`mentioned`)."""
    deps = {n: _references(n, sql) for n in sql_names(sql)}
    if only is not None and not only <= deps.keys():
        raise KeyError(f"no lineage SQL named {sorted(only - deps.keys())}")
    start = {n for n in deps if not n.startswith("_")} if only is None else set(only)
    needed = start | {PARAMS}
    todo = list(needed)
    while todo:
        for d in deps[todo.pop()] - needed:
            needed.add(d)
            todo.append(d)
    deps = {n: d for n, d in deps.items() if n in needed}
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(deps):
        ready = sorted(n for n in deps if n not in done and deps[n] <= done)
        assert ready, f"lineage SQL has a dependency cycle among {sorted(set(deps) - done)}"
        for n in ready:
            order.append(n)
            done.add(n)
    return tuple(order)


def mentioned(text: str, sql: str = "current") -> frozenset[str]:
    """The SQL names ``text`` (a statement) mentions as whole words, case-insensitively: the
    views an ad-hoc statement can read. Creating a view binds everything it reads (~0.4-0.8 s
    for a public view), so ``lineage query`` creates only these and what they read; a word
    inside a string literal only creates a view more."""
    words = set(re.findall(r"[a-z_][a-z0-9_]*", text.lower()))
    return frozenset(n for n in sql_names(sql) if n in words)


def public_views(sql: str = "current") -> tuple[str, ...]:
    return tuple(n for n in creation_order(sql) if not n.startswith("_"))
