"""``hybridmem diagnose``: why prefix reuse was lost, request by request, from a trace.

    hybridmem diagnose TRACE [--json] [--plot FILE.png] [--out DIR] [--workload FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hybridmem.cli.common import count, out_path
from hybridmem.errors import HybridMemError
from hybridmem.outputs import atomic_output, check_output, write_text_atomic

HELP = "per request: shared prompt prefix, reused tokens, and the unreused tokens by cause"

DESCRIPTION = HELP + """.

TRACE is a binary trace (a `hybridmem run` trace, `--org vllm` or an organization, or any vLLM
entry point traced with HYBRIDMEM_TRACE; verified first) or a .parquet event table (an export,
or a vLLM KV-event stream converted by `hybridmem lineage import-vllm`, which records no
requests). For every INITIAL request: the longest prompt prefix an earlier request shares
(capped at L - 1), the tokens it reused (J_adopt), and the difference by cause, in precedence:
grid (no recurrent boundary inside the shared prefix: the grid is named), never-published,
not-yet-published (published only after the lookup), lost (before the lookup; by whose
allocation or which eviction), attention-lost (A_max < boundary), cap (the L - 1 cap), other
(the unexplained rest; 0 on a clean trace). The shared prefix is measured on token ids when
the run directory (the trace's parent or grandparent) holds workload.json, or --workload
names one; otherwise on the attention hash chains, to the attention block. vLLM's own
counters (results.parquet cached_tokens, summary.json prefix_hit_tokens, the hooks'
PrefixCacheStats file) are printed beside the trace's figures when present.

The rows are the SQL views reuse_diagnosis and reuse_causes (`hybridmem lineage query TRACE
--sql "SELECT * FROM reuse_causes"`; there the prefix is measured on the chains).

exit status: 0 done, 1 when vLLM's own counters disagree with the trace, 2 bad input."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", metavar="TRACE", help="binary trace or .parquet event table")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on stdout (totals, causes, engine counters, rows)")
    p.add_argument("--plot", type=out_path((".png", ".pdf", ".svg")), default=None,
                   metavar="FILE.png", help="bar plot of unreused tokens by cause")
    p.add_argument("--out", type=out_path(), default=None, metavar="DIR",
                   help="write diagnosis.json, reuse_diagnosis.csv and reuse_causes.png there")
    p.add_argument("--workload", default=None, metavar="FILE",
                   help="workload manifest with the prompts' token ids (default: the run "
                   "directory's workload.json, if any)")
    p.add_argument("--rows", type=count(0, 1 << 20), default=20, metavar="N",
                   help="text output: list the N requests with the most unreused tokens "
                   "(default 20)")
    p.add_argument("--allow-unverified", action="store_true",
                   help="diagnose a trace whose verdict is not accepted (the output says so)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lineage.diagnose import diagnose, format_text, plot, rows_csv, to_json
    from lineage.source import open_run
    from lineage.table import LINEAGE_COLUMNS

    inputs = [args.trace] + ([args.workload] if args.workload else [])
    if args.plot:
        check_output(args.plot, inputs, "--plot")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise HybridMemError(f"--out {args.out!r} exists and is not a directory")
    run_ = open_run(args.trace, allow_unverified=args.allow_unverified, columns=LINEAGE_COLUMNS)
    d = diagnose(run_, args.workload)
    doc = to_json(d)
    if args.json:
        print(json.dumps(doc, default=str))
    else:
        print(format_text(d, rows=args.rows))
    if args.plot:
        with atomic_output(args.plot, inputs, "--plot") as tmp:
            plot(d, str(tmp))
        print(f"diagnose: plot written to {args.plot}", file=sys.stderr)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "diagnosis.json", json.dumps(doc, default=str, indent=1),
                          inputs)
        write_text_atomic(out / "reuse_diagnosis.csv", rows_csv(d), inputs)
        with atomic_output(out / "reuse_causes.png", inputs, "--out") as tmp:
            plot(d, str(tmp))
        print(f"diagnose: wrote diagnosis.json, reuse_diagnosis.csv, reuse_causes.png in {out}",
              file=sys.stderr)
    agree = d.agreement["agree"] if d.agreement else None
    return 1 if agree is False else 0
