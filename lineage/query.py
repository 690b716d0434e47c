"""``lineage query``: one read-only SQL statement over the lineage views, with bounded cost.

    sql --parse--> exactly one statement --type--> SELECT / EXPLAIN (COPY too with allow_files)
        |                                              |
        '-- 0 or 2+ statements: refused                '-- INSTALL, LOAD, ATTACH, CREATE, DROP,
                                                           SET, PRAGMA, ... : refused
    connection: views built, then  enable_external_access = false  (no file, URL or extension
    access from SQL, unless allow_files), memory_limit, lock_configuration = true (the statement
    cannot turn them back), and a timer that interrupts the statement after ``timeout_s``.

Rows stream out in batches, so a huge result costs output time, not memory.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

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
    if kind == "COPY":
        for target in _COPY_TARGET.findall(sql):
            for src in inputs:
                if same_file(target.replace("''", "'"), src):
                    raise QueryError(f"--sql: COPY ... TO {target!r} would overwrite the input "
                                     f"{src!r}")


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
