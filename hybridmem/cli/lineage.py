"""``hybridmem lineage``: entry and adopted joint depth per episode, depth classes, attribution.

    hybridmem lineage PATH... [--json] [--allow-unverified] [--plot OUT.png]
                              [--occupancy OUT.png]
    hybridmem lineage query PATH... --sql "SELECT ..."
    hybridmem lineage views
    hybridmem lineage import-vllm STREAM.msgpack OUT.parquet [--block-size N]

The first word picks the form: ``query``, ``views`` or ``import-vllm``; anything else is a path
(write ``./query`` for a file of that name).
"""

from __future__ import annotations

import argparse
import json
import sys

from hybridmem.cli.common import count, out_path, real
from hybridmem.errors import HybridMemError
from hybridmem.outputs import atomic_output, check_output, same_file

MAX_SQL_CHARS = 100_000

HELP = "episode lineage of traced runs: J_enter vs J_adopt, depth classes, loss attribution"
VERBS = ("query", "views", "import-vllm")

DESCRIPTION = HELP + """.

forms:
  hybridmem lineage PATH... [--json] [--allow-unverified] [--plot OUT.png]
                            [--occupancy OUT.png]
      per run: class counts and fractions, mean J_adopt / R_max / A_max with the M0/M1
      bracket, attribution k/n, publication/loss totals, SQL vs replay agreement. PATH is a
      binary trace (verified first) or an exported .parquet event table.
  hybridmem lineage query PATH... --sql "SELECT ..." [--allow-files] [--timeout S]
      run one read-only SQL statement (SELECT / EXPLAIN) over PATH's events and the lineage
      views it names (each created with the views it reads). With several PATHs every named
      view (and events) holds all runs' rows, led by two columns: run (the PATH) and
      organization, so one statement compares organizations; no file, URL or extension
      access from SQL unless --allow-files (which also permits COPY ... TO), a statement
      timeout (60 s) and a memory limit (2GB).
  hybridmem lineage views
      list the public views and their column comments.
  hybridmem lineage import-vllm STREAM OUT.parquet [--block-size N]
      convert a file of vLLM KVEventBatch msgpack payloads into an event table.

exit status: 0 when SQL and the scalar replay agree on every replayed episode of every run
(--replay: a deterministic sample of 2,000 requests by default, 'all', or 'off'; the report
prints the scope), 1 when they do not, 2 for bad input (one line on stderr)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lineage", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("args", nargs="*", metavar="PATH",
                   help="traces or .parquet event tables (or a form word, see above)")
    p.add_argument("--json", action="store_true", help="one JSON object per run, one per line")
    p.add_argument("--allow-unverified", action="store_true",
                   help="analyse traces whose verdict is not accepted (the output says so)")
    p.add_argument("--plot", type=out_path((".png", ".pdf", ".svg")), metavar="OUT.png",
                   default=None,
                   help="write class bars per run and a J_enter vs J_adopt scatter")
    p.add_argument("--occupancy", type=out_path((".png", ".pdf", ".svg")), metavar="OUT.png",
                   default=None,
                   help="write each run's pool occupancy over engine steps (units in use and "
                   "available at every successful allocation)")
    p.add_argument("--sql", metavar="SQL", default=None, help="the statement for 'query'")
    p.add_argument("--allow-files", action="store_true",
                   help="'query': let the statement read and write files (COPY ... TO, "
                   "read_csv); off by default: the query tool is read-only")
    p.add_argument("--timeout", type=real(0, 86_400, lo_open=True), default=60.0,
                   metavar="S", help="'query': statement timeout in seconds (default 60)")
    p.add_argument("--memory-limit", default="2GB", metavar="SIZE",
                   help="'query': DuckDB memory limit (default 2GB)")
    p.add_argument("--private", action="store_true", help="'views': also list private views")
    p.add_argument("--replay", default="2000", metavar="N|all|off",
                   help="scalar replay check: the episodes of a deterministic sample of N "
                   "requests (default 2000), of every request ('all'), or none ('off'); the "
                   "report prints the scope")
    p.add_argument("--block-size", type=count(1, 1 << 20), default=None, metavar="N",
                   help="'import-vllm': tokens per block when the stream does not say")
    p.set_defaults(func=run, option_defaults={d: p.get_default(d) for d in OPTIONS})


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _views(args: argparse.Namespace) -> int:
    from lineage.catalog import describe  # no DuckDB while the catalog file is fresh

    if args.args[1:]:
        raise HybridMemError(f"'views' takes no paths, got {args.args[1:]}")
    for name, comment, columns in describe(include_private=args.private):
        print(f"{name}: {comment}")
        for col, kind, col_comment in columns:
            print(f"  {col:<34} {kind:<10} {col_comment}")
    return 0


def _query(args: argparse.Namespace) -> int:
    from lineage.query import run_query
    from lineage.source import open_run
    from lineage.views import connect, mentioned

    paths = args.args[1:]
    if not paths:
        raise HybridMemError("'query' takes at least one PATH")
    if args.sql is None:
        raise HybridMemError("'query' needs --sql \"SELECT ...\"")
    if len(args.sql) > MAX_SQL_CHARS:
        raise HybridMemError(f"--sql is {len(args.sql):,} characters, over {MAX_SQL_CHARS:,}")
    for i, p in enumerate(paths):
        if any(same_file(p, q) for q in paths[:i]):
            raise HybridMemError(f"'query': {p!r} is given twice")
    runs = [open_run(p, allow_unverified=args.allow_unverified) for p in paths]
    if len(runs) == 1:
        # Only the views the statement names, and what they read (binding all of them cost
        # ~2.5 s), with the heavy ones among those computed once into tables: planning a
        # public view over the nested SQL cost 2-4 CPU-s even on a 4-event table, ~0.01 over
        # the tables.
        con = connect(runs[0].table, runs[0].meta, source=runs[0].path,
                      only=mentioned(args.sql), materialize=True)
        con.execute("SET preserve_insertion_order = true")  # the statement's rows in order
    else:
        from lineage.multirun import connect_runs

        con = connect_runs(runs, args.sql)
    try:
        result = run_query(con, args.sql, allow_files=args.allow_files, timeout_s=args.timeout,
                           memory_limit=args.memory_limit, inputs=[r.path for r in runs])
        try:
            if args.json:
                for row in result.rows:
                    print(json.dumps(dict(zip(result.columns, row, strict=True)), default=str))
            else:
                if result.columns:
                    print("\t".join(result.columns))
                for row in result.rows:
                    print("\t".join("NULL" if v is None else str(v) for v in row))
        finally:
            result.close()  # stops the statement timer even when printing failed
    finally:
        con.close()
    return 0


def _import_vllm(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from lineage.vllm_events import import_stream

    if len(args.args) != 3:
        raise HybridMemError(f"'import-vllm' takes STREAM OUT.parquet, got {args.args[1:]}")
    src, dst = args.args[1], args.args[2]
    if not dst.endswith(".parquet"):
        raise HybridMemError(f"output {dst!r} must end in .parquet")
    check_output(dst, (src,), "output")
    table = import_stream(src, block_size=args.block_size)
    with atomic_output(dst, (src,), "output") as tmp:
        pq.write_table(table, tmp)
    _progress(f"{src}: {table.num_rows:,} events written to {dst}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from lineage.report import analyse, format_text, plot, to_json
    from lineage.source import open_run
    from lineage.table import LINEAGE_COLUMNS

    if not args.args:
        raise HybridMemError("give at least one PATH (or 'query' / 'views' / 'import-vllm')")
    for flag, out in (("--plot", args.plot), ("--occupancy", args.occupancy)):
        if out:
            check_output(out, args.args, flag)
    if args.plot and args.occupancy and same_file(args.plot, args.occupancy):
        raise HybridMemError("--plot and --occupancy name the same file")
    replay_n = _replay_arg(args.replay)
    # open (and verify) every input first, so a bad one fails before any work is printed
    columns: tuple[str, ...] = LINEAGE_COLUMNS
    if args.occupancy:
        columns += tuple(c for c in OCCUPANCY_COLUMNS if c not in LINEAGE_COLUMNS)
    runs = [open_run(path, allow_unverified=args.allow_unverified, columns=columns)
            for path in args.args]
    reports = []
    for path, run_ in zip(args.args, runs, strict=True):
        _progress(f"lineage: {path}: {run_.table.num_rows:,} events ...")
        rep = analyse(run_, with_replay=replay_n != 0, replay_requests=replay_n or None)
        _progress(f"lineage: {path}: {rep.summary['episodes']:,} episodes, SQL "
                  f"{rep.sql_seconds:.2f} s, replay {rep.replay_seconds:.2f} s "
                  f"({rep.replay_scope})")
        reports.append(rep)
        if args.json:
            print(json.dumps(to_json(rep), default=str))
        else:
            print(format_text(rep))
    if args.plot:
        with atomic_output(args.plot, args.args, "--plot") as tmp:
            plot(reports, str(tmp))
        _progress(f"lineage: plot written to {args.plot}")
    if args.occupancy:
        from lineage.occupancy import plot_occupancy

        with atomic_output(args.occupancy, args.args, "--occupancy") as tmp:
            plot_occupancy(runs, str(tmp))
        _progress(f"lineage: occupancy written to {args.occupancy}")
    return 0 if all(r.agreement.complete for r in reports) else 1


def _replay_arg(text: str) -> int | None:
    """``--replay``: None = every request, 0 = off, N >= 1 = a sample of N requests."""
    if text == "all":
        return None
    if text == "off":
        return 0
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 1 <= n <= 10**9:
        raise HybridMemError(f"--replay must be a request count >= 1, 'all' or 'off', got "
                             f"{text!r}")
    return n


# the options each form reads (dest: flag); any other option given is refused in that form,
# never silently ignored
OCCUPANCY_COLUMNS = ("seq", "ts_ns", "kind", "step", "state_kind", "free", "outcome")
OPTIONS = {"json": "--json", "allow_unverified": "--allow-unverified", "plot": "--plot",
           "occupancy": "--occupancy",
           "sql": "--sql", "allow_files": "--allow-files", "timeout": "--timeout",
           "memory_limit": "--memory-limit", "private": "--private", "replay": "--replay",
           "block_size": "--block-size"}
FORM_OPTIONS = {
    "report": {"json", "allow_unverified", "plot", "occupancy", "replay"},
    "query": {"json", "allow_unverified", "sql", "allow_files", "timeout", "memory_limit"},
    "views": {"private"},
    "import-vllm": {"block_size"},
}


def check_form_options(args: argparse.Namespace, form: str,
                       parser_defaults: dict[str, object]) -> None:
    """Refuse an option the form does not read (one line naming it and the form)."""
    for dest, flag in OPTIONS.items():
        if dest not in FORM_OPTIONS[form] and getattr(args, dest) != parser_defaults[dest]:
            where = "the report form (lineage PATH...)" if form == "report" else f"'{form}'"
            raise HybridMemError(f"{flag} does not apply to {where}; it is an option of "
                                 + ", ".join(f"'{f}'" for f, o in FORM_OPTIONS.items()
                                             if dest in o))


def run(args: argparse.Namespace) -> int:
    verb = args.args[0] if args.args else None
    check_form_options(args, verb if verb in VERBS else "report", args.option_defaults)
    if verb == "views":
        return _views(args)
    if verb == "query":
        return _query(args)
    if verb == "import-vllm":
        return _import_vllm(args)
    return _report(args)
