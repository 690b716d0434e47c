"""Run a campaign's cells: local worker processes or a Ray cluster; resumable; runs.parquet.

::

    OUT/cells/<cell id>/{results.parquet, summary.json, workload.json}   one finished cell
    OUT/runs.parquet                                                      one row per cell
    OUT/failures.json, OUT/cells/<cell id>.error                         cells that raised
    OUT/campaign.json                                                     the spec as resolved

A cell writes into ``<cell id>.tmp`` and is renamed into place only when its summary exists, so
a cell directory is always a finished run: rerunning the campaign skips it (resume). Workers are
separate processes (``spawn``), each importing vLLM once and then taking cells one by one; with
``--ray ADDRESS`` each cell is a Ray task instead (``ADDRESS`` = ``local`` starts a local Ray, with
``--workers N`` CPUs when given, else all cores).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from hybridmem.errors import HybridMemError
from hybridmem.sim.campaign_spec import AXES, LATE_AXES, CampaignSpec, Cell

METRICS = ("throughput_tok_s", "throughput_ledger_tok_s", "ttft_p50", "ttft_p99", "e2e_p50",
           "e2e_p99", "preemptions", "prefix_hit_tokens", "requests", "completed",
           "output_tokens", "request_span_s", "num_blocks", "steps", "wall_s",
           "recorded_prompt_tokens", "recorded_prompt_full_tokens", "recorded_output_tokens",
           "recorded_total_tokens", "recorded_records", "poll_running_mean",
           "poll_running_median", "poll_waiting_mean", "poll_waiting_median",
           "poll_waiting_max", "block_tokens")
# lineage over a traced cell's events (lineage.json; means over classified INITIAL episodes)
LINEAGE_METRICS = ("lineage_j_adopt", "lineage_r_max_m0", "lineage_r_max_m1",
                   "lineage_a_max_m0", "lineage_a_max_m1", "lineage_gap_r_m1",
                   "lineage_initial_episodes", "lineage_resume_episodes", "lineage_agree")
LINEAGE_FILE = "lineage.json"
RUNS_FILE = "runs.parquet"
# how long finished workers get to exit before they are terminated (their outputs are written)
WORKER_EXIT_GRACE_S = 3.0


def cell_job(spec_fixed: dict[str, Any], cell: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Run one cell (see :func:`_cell_job`); a cell that raises returns ``{"error": ...}`` and
    leaves ``<cell id>.error`` with the traceback, so one bad cell never stops the campaign."""
    try:
        return _cell_job(spec_fixed, cell, out_dir)
    except Exception as exc:
        import traceback

        Path(out_dir + ".error").write_text(traceback.format_exc())
        # a failed cell leaves its traceback, never a half-written <cell id>.tmp folder
        shutil.rmtree(out_dir + ".tmp", ignore_errors=True)
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}


def _cell_job(spec_fixed: dict[str, Any], cell: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Run one cell into ``out_dir`` (atomically); returns its runs.parquet row. Top level so
    process pools and Ray can ship it."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hybridmem.sim.run import SimConfig, run_sim

    final = Path(out_dir)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    traced = bool(cell.get("trace", False))
    # vLLM's own manager has no pinning: its cell keeps the grid's pin_k for pairing only
    pin_k = None if cell["org"] == "vllm" else cell["pin_k"]
    cfg = SimConfig(model=spec_fixed["model"], device=spec_fixed["device"], org=cell["org"],
                    budget=cell["budget"], requests=spec_fixed["requests"], rate=cell["rate"],
                    share=cell["share"], seed=cell["seed"], cap=cell["cap"],
                    headroom=cell["headroom"], pin_k=pin_k, retention=cell["retention"],
                    isolate=cell["isolate"], trace_dir=tmp / "trace" if traced else None,
                    out=tmp, max_model_len=spec_fixed["max_model_len"],
                    constants=spec_fixed["cost"], grid=spec_fixed.get("grid"),
                    attention_fraction=spec_fixed.get("attention_fraction"),
                    chunking=cell.get("chunking"),
                    system_prompt=_pair(spec_fixed.get("system_prompt_tokens")))
    result = run_sim(cfg)
    if traced:
        _write_json(tmp / LINEAGE_FILE, cell_lineage(result.summary["trace_path"]))
        # the summary names the trace where it will lie once the cell is in place
        summary = dict(result.summary)
        summary["trace_path"] = str(final / "trace" / Path(summary["trace_path"]).name)
        _write_json(tmp / "summary.json", summary)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return row_of(final.name, cell, json.loads((final / "summary.json").read_text()),
                  read_lineage(final))


def cell_lineage(trace_path: str) -> dict[str, Any]:
    """The lineage report (``lineage.report.to_json``) of one traced cell: J_adopt, R_max,
    A_max (M0/M1) means over INITIAL episodes, episode classes, replay agreement."""
    from lineage.report import analyse
    from lineage.report import to_json as lineage_json
    from lineage.source import open_run

    return lineage_json(analyse(open_run(trace_path)))


def read_lineage(cell_dir: Path) -> dict[str, Any] | None:
    path = cell_dir / LINEAGE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def lineage_row(lin: dict[str, Any] | None) -> dict[str, float]:
    nan = float("nan")
    if lin is None:
        return dict.fromkeys(LINEAGE_METRICS, nan)
    means = lin["means_initial"]

    def num(v: Any) -> float:
        return float(v) if v is not None else nan
    j = num(means["j_adopt"])
    agree = lin["replay_agreement"]
    return {"lineage_j_adopt": j,
            "lineage_r_max_m0": num(means["r_max"]["m0"]),
            "lineage_r_max_m1": num(means["r_max"]["m1"]),
            "lineage_a_max_m0": num(means["a_max"]["m0"]),
            "lineage_a_max_m1": num(means["a_max"]["m1"]),
            "lineage_gap_r_m1": num(means["r_max"]["m1"]) - j,
            "lineage_initial_episodes": float(lin["initial_episodes"]),
            "lineage_resume_episodes": float(lin["resume_episodes"]),
            "lineage_agree": float(agree["agree"] == agree["episodes"])}


def row_of(cell_id: str, cell: dict[str, Any], summary: dict[str, Any],
           lineage: dict[str, Any] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"cell_id": cell_id}
    row.update({k: cell.get(k, LATE_AXES.get(k)) for k in (*AXES, "seed")})
    row["pin_k"] = -1 if cell["pin_k"] is None else int(cell["pin_k"])  # -1: off (typed column)
    row["chunking"] = row["chunking"] or "default"  # typed column: "default" = the key omitted
    for m in METRICS:
        v = summary.get(m)
        row[m] = float(v) if v is not None else float("nan")
    row.update(lineage_row(lineage))
    return row


def _pair(v: Any) -> tuple[int, int] | None:
    return None if v is None else (int(v[0]), int(v[1]))


def _fixed(spec: CampaignSpec) -> dict[str, Any]:
    return {"model": spec.model, "device": spec.device, "requests": spec.requests,
            "max_model_len": spec.max_model_len, "cost": dict(spec.cost), "grid": spec.grid,
            "attention_fraction": spec.attention_fraction,
            "system_prompt_tokens": spec.system_prompt_tokens}


def run_campaign(spec: CampaignSpec, out: Path, workers: int = 1, ray_address: str | None = None,
                 log: Callable[[str], None] | None = None, ray_cpus: int | None = None) -> Path:
    """Run every unfinished cell of ``spec`` and write ``out/runs.parquet``. ``ray_cpus``: the
    CPUs of the Ray instance ``ray_address="local"`` starts (None: Ray's default, all cores)."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if not isinstance(workers, int) or not 1 <= workers <= 256:
        raise HybridMemError(f"workers must be an integer in [1, 256], got {workers}")
    if ray_cpus is not None and (not isinstance(ray_cpus, int) or not 1 <= ray_cpus <= 256):
        raise HybridMemError(f"ray_cpus must be an integer in [1, 256], got {ray_cpus}")
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out / "campaign.json", {"name": spec.name, "question": spec.question,
                                        "fixed": _fixed(spec), "cells": len(spec.cells),
                                        "metrics": spec.metrics, "level": spec.level,
                                        "contrasts": [asdict(c) for c in spec.contrasts],
                                        "paper": [asdict(f) for f in spec.paper]})
    todo: list[tuple[str, Cell]] = []
    done_rows: dict[str, dict[str, Any]] = {}
    for cell in spec.cells:
        cid = spec.cell_id(cell)
        summary = cells_dir / cid / "summary.json"
        if summary.is_file():
            done_rows[cid] = row_of(cid, cell.params, json.loads(summary.read_text()),
                                    read_lineage(cells_dir / cid))
            (cells_dir / (cid + ".error")).unlink(missing_ok=True)
        else:
            todo.append((cid, cell))
    # seed-major: every finished seed completes its paired set before the next seed starts, so
    # a campaign stopped early still has whole pairs to compare
    order = {seed: i for i, seed in enumerate(dict.fromkeys(c.seed for c in spec.cells))}
    todo.sort(key=lambda item: order[item[1].seed])
    say(f"campaign {spec.name}: {len(spec.cells)} cells, {len(done_rows)} finished, "
        f"{len(todo)} to run on {'Ray ' + ray_address if ray_address else f'{workers} worker(s)'}")
    t0 = time.perf_counter()
    fixed = _fixed(spec)
    failed: dict[str, str] = {}
    if todo:
        if ray_address:
            _run_ray(ray_address, fixed, todo, cells_dir, done_rows, failed, say, t0, ray_cpus)
        elif workers == 1:
            for i, (cid, cell) in enumerate(todo, 1):
                _record(done_rows, failed, cid, cell_job(fixed, cell.params, str(cells_dir / cid)),
                        f"{i}/{len(todo)}", t0, say)
        else:
            _run_pool(workers, fixed, todo, cells_dir, done_rows, failed, say, t0)
    _write_json(out / "failures.json", failed)
    if failed:
        say(f"campaign {spec.name}: {len(failed)} cell(s) failed (tracebacks in "
            f"cells/<id>.error, list in failures.json); runs.parquet holds the rest")
    return write_runs(out, [done_rows[cid] for cid in (spec.cell_id(c) for c in spec.cells)
                            if cid in done_rows])


def _record(rows: dict[str, dict[str, Any]], failed: dict[str, str], cid: str,
            row: dict[str, Any], count: str, t0: float, say: Callable[[str], None]) -> None:
    if "error" in row:
        failed[cid] = row["error"]
        say(f"  {count} {cid} FAILED: {row['error']}")
    else:
        rows[cid] = row
        say(f"  {count} {cid} ({time.perf_counter() - t0:.0f} s)")


def _run_pool(workers: int, fixed: dict[str, Any], todo: list[tuple[str, Cell]], cells_dir: Path,
              rows: dict[str, dict[str, Any]], failed: dict[str, str], say: Callable[[str], None],
              t0: float) -> None:
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
    try:
        futures: dict[Future[dict[str, Any]], str] = {
            pool.submit(cell_job, fixed, cell.params, str(cells_dir / cid)): cid
            for cid, cell in todo}
        pending = set(futures)
        n = 0
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                n += 1
                _record(rows, failed, futures[fut], fut.result(), f"{n}/{len(todo)}", t0, say)
    finally:
        _close_pool(pool)


def _close_pool(pool: ProcessPoolExecutor) -> None:
    """Shut the pool down without waiting on a worker that does not exit: every cell's outputs
    are written by now, and a worker process that imported vLLM can linger (threads of the
    libraries it loaded), keeping the campaign alive after its last cell. Each gets
    ``WORKER_EXIT_GRACE_S`` to exit on its own, then is terminated."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    _wait_dead(procs, WORKER_EXIT_GRACE_S)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    _wait_dead(procs, 5.0)
    for proc in procs:
        if proc.is_alive():  # SIGTERM not acted on in time (a loaded box): nothing is left to lose
            proc.kill()
    _wait_dead(procs, 30.0)


def _wait_dead(procs: list[Any], timeout_s: float) -> None:
    """Poll until every process has exited or ``timeout_s`` passed. Not ``Process.join``: a
    worker in interpreter teardown closes its sentinel pipe early, so ``join`` returns while the
    process still runs."""
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)


def _run_ray(address: str, fixed: dict[str, Any], todo: list[tuple[str, Cell]], cells_dir: Path,
             rows: dict[str, dict[str, Any]], failed: dict[str, str], say: Callable[[str], None],
             t0: float, cpus: int | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise HybridMemError("--ray needs the 'ray' package (pip install ray)") from None
    started = not ray.is_initialized()
    if started:
        local = address == "local"
        ray.init(address=None if local else address, num_cpus=cpus if local else None,
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        remote = ray.remote(num_cpus=1)(cell_job)
        refs = {remote.remote(fixed, cell.params, str(cells_dir / cid)): cid
                for cid, cell in todo}
        pending = list(refs)
        n = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                n += 1
                _record(rows, failed, refs[ref], ray.get(ref), f"{n}/{len(todo)} Ray", t0, say)
    finally:
        if started:
            ray.shutdown()


def write_runs(out: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = out / RUNS_FILE
    tmp = out / (RUNS_FILE + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
    return path


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)
