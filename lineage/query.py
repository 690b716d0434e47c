"""``lineage query``: one read-only SQL statement over the lineage views, with bounded cost.

    sql --parse--> exactly one statement --type--> SELECT / EXPLAIN (COPY too with allow_files)
        |                                              |
        '-- 0 or 2+ statements: refused                '-- INSTALL, LOAD, ATTACH, CREATE, DROP,
                                                           SET, PRAGMA, EXPORT ... : refused

    EXPLAIN [ANALYZE] only of a SELECT (ANALYZE runs the statement it explains).
    COPY ... TO (allow_files): every TO must be followed by one single-quoted local path (no
    dollar quoting, parameters, comments or URLs: a target the text cannot show for sure is
    refused), and no target may be an input or the folder holding one (a partitioned COPY
    with OVERWRITE empties its folder).
    connection: views built, then  enable_external_access = false  (no file, URL or extension
    access from SQL, unless allow_files), memory_limit, lock_configuration = true (the statement
    cannot turn them back), and a timer that interrupts the statement after ``timeout_s``.

Rows stream out in batches, so a huge result costs output time, not memory.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from hybridmem.errors import HybridMemError
from hybridmem.outputs import same_file

READ_ONLY = ("SELECT", "EXPLAIN")
WITH_FILES = READ_ONLY + ("COPY",)
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_LIMIT = "2GB"
BATCH_ROWS = 10_000


class QueryError(HybridMemError):
    """A statement refused by the read-only rules, or one that failed in DuckDB."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: Iterator[tuple[object, ...]]
    stop: Callable[[], None] = lambda: None  # stops the statement timer (and waits for it)

    def close(self) -> None:
        """Stop the timer: the rows are done with (read to the end or not)."""
        self.stop()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_COPY_TARGET = re.compile(r"\bTO\s+'((?:[^']|'')*)'", re.IGNORECASE)
_TO_WORD = re.compile(r"\bTO\b", re.IGNORECASE)
_EXPLAIN = re.compile(r"\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _explained_kind(con: duckdb.DuckDBPyConnection, sql: str) -> str | None:
    """The type of the statement an EXPLAIN [ANALYZE] runs (None: not one plain statement,
    e.g. a comment or an option list between the words)."""
    m = _EXPLAIN.match(sql)
    if m is None:
        return None
    try:
        inner = con.extract_statements(sql[m.end():])
    except duckdb.Error:
        return None
    return inner[0].type.name if len(inner) == 1 else None


def copy_targets(sql: str) -> list[str]:
    """Every target a ``COPY ... TO`` may write, or :class:`QueryError` when one cannot be read
    off the text for sure: each ``TO`` word must be followed by one single-quoted path (a
    dollar-quoted, escaped or commented target, or a parameter, is refused, as is any ``$``)."""
    if "$" in sql:
        raise QueryError("--sql: COPY with --allow-files takes its target as one single-quoted "
                         "path; dollar quoting and parameters are refused")
    words = _TO_WORD.findall(sql)
    targets = [t.replace("''", "'") for t in _COPY_TARGET.findall(sql)]
    if not targets or len(targets) != len(words):
        raise QueryError("--sql: COPY with --allow-files needs every TO followed by one "
                         "single-quoted path (TO 'out.csv'); this statement's target cannot be "
                         "checked, so it is refused")
    for t in targets:
        if _SCHEME.match(t):
            raise QueryError(f"--sql: COPY ... TO {t!r}: a URL or scheme target is refused; "
                             "give a local path")
    return targets


def check_copy_target(target: str, inputs: Iterable[str]) -> None:
    """A COPY target must not be an input, nor a folder holding one (or holding its folder):
    a partitioned COPY with OVERWRITE deletes what the folder held."""
    path = Path(os.path.expanduser(target))
    for src in inputs:
        if same_file(path, src):
            raise QueryError(f"--sql: COPY ... TO {target!r} would overwrite the input {src!r}")
        try:
            folder, src_path = path.resolve(), Path(src).resolve()
        except (OSError, RuntimeError):
            raise QueryError(f"--sql: COPY ... TO {target!r}: cannot resolve the path") from None
        if folder == src_path.parent or folder in src_path.parents:
            raise QueryError(f"--sql: COPY ... TO {target!r} names the folder of the input "
                             f"{src!r} (a partitioned or OVERWRITE copy could delete it); "
                             "write elsewhere")


def check_statement(con: duckdb.DuckDBPyConnection, sql: str, allow_files: bool,
                    inputs: Iterable[str] = ()) -> None:
    """Exactly one statement of an allowed type, or :class:`QueryError`. A ``COPY ... TO``
    (with ``allow_files``) must not name one of ``inputs``."""
    if not sql.strip():
        raise QueryError("--sql is empty")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"--sql does not parse: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise QueryError(f"--sql must hold exactly one statement, got {len(statements)}")
    kind = statements[0].type.name
    allowed = WITH_FILES if allow_files else READ_ONLY
    if kind not in allowed:
        hint = " (--allow-files permits COPY ... TO)" if kind == "COPY" else ""
        raise QueryError(f"--sql: a {kind} statement is not allowed; the query tool is "
                         f"read-only and runs {' / '.join(allowed)} only{hint}")
    if kind == "EXPLAIN":
        # EXPLAIN ANALYZE runs its statement: only a SELECT may be explained
        inner = _explained_kind(con, sql)
        if inner != "SELECT":
            raise QueryError(f"--sql: EXPLAIN runs only over a SELECT, got "
                             f"{inner or 'a statement it cannot read'}")
    if kind == "COPY":
        inputs = list(inputs)
        for target in copy_targets(sql):
            check_copy_target(target, inputs)


def lock_down(con: duckdb.DuckDBPyConnection, allow_files: bool = False,
              memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
    """No external access (unless ``allow_files``), a memory limit, settings locked."""
    try:
        con.execute("SET memory_limit = ?", [memory_limit])
    except duckdb.Error as exc:
        raise QueryError(f"bad memory limit {memory_limit!r}: {_first_line(exc)}") from None
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    if not allow_files:
        con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def run_query(con: duckdb.DuckDBPyConnection, sql: str, *, allow_files: bool = False,
              timeout_s: float = DEFAULT_TIMEOUT_S,
              memory_limit: str = DEFAULT_MEMORY_LIMIT, inputs: Iterable[str] = ()
              ) -> QueryResult:
    """Check, lock down and run ``sql``; rows are fetched lazily under the same timeout."""
    check_statement(con, sql, allow_files, inputs)
    lock_down(con, allow_files, memory_limit)
    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        con.interrupt()

    timer = threading.Timer(timeout_s, interrupt)
    timer.daemon = True
    timer.start()

    def stop_timer() -> None:
        # joined, not only cancelled: the timer's function holds ``con``, and a timer thread
        # still ending at interpreter exit could drop the last reference there and run
        # DuckDB's destructor in a thread being torn down (abort, exit status 134)
        timer.cancel()
        timer.join()

    def failed(exc: BaseException) -> QueryError:
        if timed_out.is_set():
            return QueryError(f"--sql ran past the {timeout_s:g} s statement timeout "
                              "(--timeout)")
        return QueryError(f"--sql: {_first_line(exc)}")

    try:
        rel = con.execute(sql)
        columns = [d[0] for d in rel.description] if rel.description else []
    except (duckdb.Error, RuntimeError) as exc:
        stop_timer()
        raise failed(exc) from None

    def rows() -> Iterator[tuple[object, ...]]:
        try:
            if not columns:
                return
            while True:
                batch = rel.fetchmany(BATCH_ROWS)
                if not batch:
                    return
                yield from batch
        except (duckdb.Error, RuntimeError) as exc:
            raise failed(exc) from None
        finally:
            stop_timer()

    return QueryResult(columns, rows(), stop_timer)
