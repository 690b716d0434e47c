"""``hybridmem trace``: verify, export, summarize and benchmark binary traces (tracer/FORMAT.md)."""

from __future__ import annotations

import argparse
import sys

from hybridmem.cli.common import count, out_path, print_json
from hybridmem.errors import HybridMemError

HELP = "verify, export, summarize or benchmark a binary event trace"
MAX_BENCH_EVENTS = 5_000_000  # the bench holds every event and its arguments in memory (~1 KB)
VERIFY_EXIT = {True: 0, False: 1}  # unreadable input raises TraceError -> exit 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help=HELP, description=HELP + " (format: tracer/FORMAT.md).")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND",
                            parser_class=type(p))
    tsub.required = True

    v = tsub.add_parser(
        "verify", help="judge a trace: exit 0 accepted, 1 not accepted, 2 unreadable",
        description="Accepted only if END is present, sequence numbers have no gap, nothing was "
        "dropped, there were no write errors and no damaged packets (SPEC §6). Exit 0 accepted, "
        "1 not accepted, 2 unreadable input.")
    v.add_argument("path", metavar="PATH")
    v.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    v.set_defaults(func=run_verify)

    e = tsub.add_parser("export", help="write the event table (Parquet) or a Perfetto timeline",
                        description="Export the events of every intact packet; the verdict "
                        "travels in the output's metadata.")
    e.add_argument("path", metavar="PATH")
    out = e.add_mutually_exclusive_group(required=True)
    out.add_argument("--parquet", type=out_path(), metavar="OUT",
                     help="Parquet event table (tracer/FORMAT.md)")
    out.add_argument("--perfetto", type=out_path(), metavar="OUT",
                     help="Chrome/Perfetto JSON timeline: a track per request, counter "
                     "tracks of pool units in use / available, a flow from each loss to the "
                     "request whose entry it took")
    e.set_defaults(func=run_export)

    s = tsub.add_parser("stats", help="event counts by kind and by request, time span")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--top", type=count(0, 1_000_000), default=10, metavar="N",
                   help="requests listed in the text output (default 10)")
    s.set_defaults(func=run_stats)

    b = tsub.add_parser("bench", help="ns/event of the writer, enabled and disabled",
                        description="Write a synthetic but realistic trace of N events and "
                        "print the writer's cost per event with tracing enabled and disabled "
                        "(fastest of --repeats loops).")
    b.add_argument("--events", type=count(1, MAX_BENCH_EVENTS), default=200_000, metavar="N",
                   help=f"events to write (default 200000, at most {MAX_BENCH_EVENTS:,}: the "
                   "benchmark holds its events in memory)")
    b.add_argument("--out", type=out_path(), metavar="PATH",
                   help="trace to write (default: a temporary file); an existing file is "
                   "refused unless --force (a run's trace is an input, never a scratch file)")
    b.add_argument("--force", action="store_true",
                   help="replace an existing --out, if it is a hybridmem trace")
    b.add_argument("--repeats", type=count(1, 100), default=3, metavar="R",
                   help="timed loops per figure; the fastest is reported (default 3)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=run_bench)


def run_verify(args: argparse.Namespace) -> int:
    from tracer.verdict import verify

    verdict = verify(args.path)
    if args.json:
        print_json(verdict.as_dict())
    else:
        print(f"{args.path}: {verdict.reason} (records {verdict.records:,}, recovered "
              f"{verdict.recovered_records:,}, gaps {verdict.gaps}, dropped {verdict.dropped}, "
              f"write errors {verdict.write_errors}, checksum errors {verdict.checksum_errors})")
    return VERIFY_EXIT[verdict.accepted]


def run_export(args: argparse.Namespace) -> int:
    from tracer.export import write_parquet, write_perfetto

    try:
        if args.parquet:
            verdict = write_parquet(args.path, args.parquet)
            out = args.parquet
        else:
            verdict = write_perfetto(args.path, args.perfetto)
            out = args.perfetto
    except OSError as exc:
        target = exc.filename or args.parquet or args.perfetto
        raise HybridMemError(f"cannot write {target!r}: {exc.strerror or exc}") from None
    print(f"wrote {out} ({verdict.recovered_records:,} events; trace {verdict.reason})")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    from tracer.stats import format_stats, trace_stats

    if args.top < 0:
        raise HybridMemError(f"--top must be >= 0, got {args.top}")
    s = trace_stats(args.path)
    if args.json:
        print_json(s)
    else:
        print(format_stats(s, args.top))
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from hybridmem.outputs import check_output
    from tracer.bench import run_bench as bench
    from tracer.format import MAGIC

    if args.out is not None:
        out = check_output(args.out, what="--out")
        if out.exists() and not args.force:
            raise HybridMemError(f"--out {args.out!r} exists; give --force to replace it or "
                                 "name a new file")
        if out.exists():  # only ever replace an earlier benchmark trace, never a foreign file
            if not out.is_file():
                raise HybridMemError(f"--out {args.out!r} is not a regular file")
            with open(out, "rb") as fh:
                if fh.read(len(MAGIC)) != MAGIC:
                    raise HybridMemError(f"--out {args.out!r} exists and is not a hybridmem "
                                         "trace; refusing to overwrite it")
    if args.events < 1:
        raise HybridMemError(f"--events must be >= 1, got {args.events}")
    if args.repeats < 1:
        raise HybridMemError(f"--repeats must be >= 1, got {args.repeats}")
    try:
        r = bench(args.events, args.out, args.repeats,
                  progress=lambda msg: print(f"trace bench: {msg}", file=sys.stderr))
    except OSError as exc:
        target = exc.filename or args.out
        raise HybridMemError(f"cannot write {target!r}: {exc.strerror or exc}") from None
    if args.json:
        print_json(r)
    else:
        print(f"{r['events']:,} events -> {r['path']} ({r['bytes']:,} B, trace "
              f"{'accepted' if r['accepted'] else 'NOT accepted'})")
        print(f"writer   {r['writer_path']:<13} {r['writer_path_note']}")
        print(f"floor    pack_into     {r['floor_ns_per_event']:8.1f} ns/event (same run)")
        print(f"enabled  on_event      {r['ns_per_event_enabled']:8.1f} ns/event = "
              f"{r['ratio_to_floor']:.2f}x the floor (median of rounds "
              f"{r['ratio_to_floor_median']:.2f}x; CPU {r['cpu_ratio_to_floor']:.2f}x)")
        if r["ns_per_event_enabled_pure"] is not None:
            print(f"enabled  on_event, python {r['ns_per_event_enabled_pure']:5.1f} ns/event = "
                  f"{r['ratio_to_floor_pure']:.2f}x the floor (median of rounds "
                  f"{r['ratio_to_floor_pure_median']:.2f}x; CPU "
                  f"{r['cpu_ratio_to_floor_pure']:.2f}x)")
        print(f"enabled  record()      {r['ns_per_event_enabled_record']:8.1f} ns/event")
        print(f"enabled  same event    {r['ns_per_event_enabled_same_event']:8.1f} ns/event")
        print(f"enabled  incl. close   {r['ns_per_event_enabled_with_close']:8.1f} ns/event")
        print(f"enabled  CPU, emitting thread {r['cpu_ns_per_event_enabled_thread']:8.1f} "
              f"ns/event; whole process incl. flusher and close "
              f"{r['cpu_ns_per_event_enabled_process']:.1f}")
        print(f"disabled call site     {r['ns_per_event_disabled_call_site']:8.1f} ns/event "
              f"(net {r['ns_per_event_disabled_call_site_net']:.1f}): `if self._emitting:`, "
              "as the organizations' hot call sites pay it")
        print(f"disabled enabled-guard {r['ns_per_event_disabled_guard']:8.1f} ns/event "
              f"(net {r['ns_per_event_disabled_guard_net']:.1f}): `if writer.enabled:`")
        print(f"disabled NULL_WRITER   {r['ns_per_event_disabled']:8.1f} ns/event "
              f"(net {r['ns_per_event_disabled_net']:.1f}): NULL_WRITER.on_event(e), unguarded")
        print(f"(loop overhead {r['ns_loop_overhead']:.1f} ns/event included above, subtracted "
              f"in 'net'; fastest of {r['repeats']})")
    return 0
