"""A run's summary as text a person reads: units on every figure, and which throughput to read.

``run`` and ``sim`` print this on stdout; with ``--json`` they print the summary object alone
(so ``| jq`` works) and everything else goes to stderr.
"""

from __future__ import annotations

from typing import Any


def ms(seconds: Any) -> str:
    """Seconds as milliseconds with three significant digits (``12.3 ms``, ``1,234 ms``)."""
    if not isinstance(seconds, int | float) or seconds != seconds:
        return "-"
    v = seconds * 1e3
    digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f} ms"


def tok_s(rate: Any) -> str:
    if not isinstance(rate, int | float) or rate != rate:
        return "-"
    return f"{rate:,.1f} tok/s"


def _verdict(v: Any) -> str:
    if not isinstance(v, dict):
        return "no trace"
    return "accepted" if v.get("accepted") else f"NOT accepted ({v.get('reason')})"


def format_summary(s: dict[str, Any], simulated: bool = False) -> str:
    org = s.get("organization") or s.get("org") or "vllm"
    budget = s.get("budget")
    where = (f"simulated {s.get('device')} GPU, virtual time (cost model)" if simulated
             else "CPU wall-clock time: the figures measure this machine as much as the "
             "organization")
    head = f"{org}" + (f" at budget {budget}" if budget else " (vLLM's own manager)")
    if s.get("budget_bytes"):
        head += f" ({s['budget_bytes']:,} B per layer)"
    lines = [
        f"{head}: {s.get('completed')}/{s.get('requests')} requests completed, seed "
        f"{s.get('seed')}; {where}",
        f"  throughput   {tok_s(s.get('throughput_tok_s'))} (output tokens over the request "
        "span, first arrival to last completion: read this one)",
    ]
    if s.get("throughput_ledger_tok_s") is not None:
        lines.append(f"               {tok_s(s.get('throughput_ledger_tok_s'))} over the ledger "
                     "interval (also pays engine shutdown and the trace flush)")
    lines += [
        f"  TTFT         p50 {ms(s.get('ttft_p50'))}, p99 {ms(s.get('ttft_p99'))} "
        "(arrival to first token)",
        f"  E2E          p50 {ms(s.get('e2e_p50'))}, p99 {ms(s.get('e2e_p99'))} "
        "(arrival to last token)",
        f"  preemptions  {s.get('preemptions')}; prefix-hit tokens {s.get('prefix_hit_tokens'):,}"
        if isinstance(s.get("prefix_hit_tokens"), int)
        else f"  preemptions  {s.get('preemptions')}",
    ]
    if s.get("block_tokens") is not None:
        lines.append(f"  blocks       {s.get('num_blocks')} of {s['block_tokens']:,} tokens "
                     "(the scheduler's block: S0-S2 their grid, D0 its 16-token unit, "
                     "vllm its unified page)")
    if simulated and s.get("wall_s") is not None:
        lines.append(f"  simulation   {s.get('steps')} engine steps in {s['wall_s']:,.1f} s of "
                     "real time")
    if s.get("trace_path"):
        lines.append(f"  trace        {s['trace_path']}: {_verdict(s.get('trace_verdict'))}")
    return "\n".join(lines)
