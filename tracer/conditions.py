"""The conditions of a run, in words, from its trace metadata: the title every figure carries.

    describe(meta) -> "S2, budget b63, 20 requests, seed 0 | simulated a100-40gb, cost model
                       uncalibrated (preset constants), virtual time"
                      "S2, budget b40, 150 requests, seed 1 | served by vLLM on CPU, wall clock"

Keys read (``tracer/FORMAT.md``): ``organization``, ``budget``, ``workload.requests``,
``seed``, ``simulated``, ``device``, ``cost_constants`` (a simulation's constants given on the
command line, e.g. a calibration's fit; empty or absent: the device preset's), ``arrivals``.
A key the run did not record prints as ``?``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _get(meta: Mapping[str, Any], *path: str) -> Any:
    cur: Any = meta
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    return cur


def _show(v: Any) -> str:
    return "?" if v is None else str(v)


def clock(meta: Mapping[str, Any]) -> str:
    """Simulated (device, calibrated or not, virtual time) or served (device, wall clock)."""
    if meta.get("simulated"):
        consts = meta.get("cost_constants")
        if consts is None:
            cal = "cost model calibration not recorded"
        elif consts:
            cal = "cost model calibrated (constants " + ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(consts.items())) + ")"
        else:
            cal = "cost model uncalibrated (preset constants)"
        return f"simulated {_show(meta.get('device'))}, {cal}, virtual time"
    device = meta.get("device")
    where = f" on {device.upper() if device == 'cpu' else device}" if device else ""
    arrivals = meta.get("arrivals")
    how = f"; arrivals by {arrivals}" if arrivals else ""
    return f"served by vLLM{where}, wall clock{how}"


def _budget(meta: Mapping[str, Any]) -> str:
    if meta.get("budget") is not None:
        return f"budget {meta['budget']}"
    if meta.get("organization") == "vllm" and meta.get("num_blocks") is not None:
        return f"{meta['num_blocks']} KV blocks"
    return "budget ?"


def run_label(meta: Mapping[str, Any]) -> str:
    """Organization, budget, requests and seed."""
    return (f"{_show(meta.get('organization'))}, {_budget(meta)}, "
            f"{_show(_get(meta, 'workload', 'requests'))} requests, "
            f"seed {_show(meta.get('seed'))}")


def describe(meta: Mapping[str, Any]) -> str:
    return f"{run_label(meta)} | {clock(meta)}"


def describe_runs(metas: list[Mapping[str, Any]]) -> str:
    """One title for several runs: the shared conditions once, what differs listed."""
    if not metas:
        return ""
    if len(metas) == 1:
        return describe(metas[0])
    orgs = ", ".join(dict.fromkeys(_show(m.get("organization")) for m in metas))
    fields = {"{} ": [_budget(m) for m in metas],
              "{} requests": [_show(_get(m, "workload", "requests")) for m in metas],
              "seed {}": [_show(m.get("seed")) for m in metas]}
    parts = [orgs]
    for form, vals in fields.items():
        parts.append(form.format("/".join(dict.fromkeys(vals))).strip())
    clocks = list(dict.fromkeys(clock(m) for m in metas))
    return ", ".join(parts) + " | " + "; ".join(clocks)


def summary_meta(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The keys :func:`describe` reads, from a run's ``summary.json`` (``hybridmem run`` or
    ``hybridmem sim``), for figures drawn from summaries rather than traces."""
    cfg = summary.get("config") if isinstance(summary.get("config"), Mapping) else {}
    assert isinstance(cfg, Mapping)
    sim = summary.get("driver") == "sim" or bool(summary.get("simulated"))
    return {"organization": summary.get("organization") or cfg.get("org"),
            "budget": summary.get("budget", cfg.get("budget")),
            "workload": {"requests": summary.get("requests", cfg.get("requests"))},
            "seed": summary.get("seed", cfg.get("seed")),
            "simulated": sim, "device": summary.get("device", cfg.get("device")),
            "cost_constants": cfg.get("constants") if sim else None,
            "arrivals": summary.get("arrivals")}
