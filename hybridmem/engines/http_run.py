"""Run driver over HTTP: the same workload replayed against a ``vllm serve`` subprocess.

:func:`run_serving_http` starts vLLM's OpenAI-compatible server (:mod:`.vllm_server`, loopback
only) with the settings of :class:`~hybridmem.engines.vllm_run.RunConfig`, waits for /health, and
replays the workload with asyncio + httpx: each request is sent when its planned Poisson arrival
time has passed (open loop), as ``POST /v1/completions`` with ``prompt`` = token ids,
``max_tokens``, ``temperature`` 0, ``ignore_eos``, ``return_token_ids`` (so outputs are token
ids, not text), ``cache_salt`` in isolate mode, and streamed, so TTFT is the arrival of the first
chunk that carries an output token::

    server start ── /health ── t0 = r0 arrives ── ... ── last done ── server stopped (END written)
    |<- engine_init_s ------>| |<-------- request span ------->|
                               |<-------- ledger interval ------------------------------------>|

Results and summary are written by :mod:`.run_results`, like the in-process path. Differences:
``cached_tokens`` comes from the final usage chunk (``prompt_tokens_details.cached_tokens``),
``preemptions`` from the server's ``vllm:num_preemptions_total`` counter (before - after),
``engine_request_id`` from the trace's WAITING_ENTRY ids (``cmpl-<request_id>-0-<8 chars>``;
without a trace, ``cmpl-<request_id>-0``, the id before vLLM's random suffix), ``cpu_s`` sums the
server's process tree and this process over the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hybridmem.engines.run_results import RequestRecord, RunResult, summarize, write_run
from hybridmem.engines.vllm_run import (
    RunConfig,
    arrivals_text,
    org_env,
    org_grid,
    org_summary,
    prepare_run,
)
from hybridmem.engines.vllm_server import SERVED_NAME, ServerSettings, VllmServer
from hybridmem.names import ENV_TRACE, ENV_TRACE_META
from hybridmem.workload import WorkloadRequest

SERVER_LOG = "server.log"


def completion_body(r: WorkloadRequest) -> dict[str, Any]:
    """The /v1/completions request body of one workload request (streamed, greedy)."""
    body: dict[str, Any] = {
        "model": SERVED_NAME, "prompt": list(r.prompt_token_ids),
        "max_tokens": r.max_output_tokens, "temperature": 0.0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
    }
    if r.cache_salt is not None:
        body["cache_salt"] = r.cache_salt
    return body


def apply_chunk(rec: RequestRecord, chunk: dict[str, Any], now: float) -> None:
    """Fold one streamed ``data:`` object into the record (tokens, finish, usage)."""
    for choice in chunk.get("choices") or []:
        new = choice.get("token_ids") or []
        if new and math.isnan(rec.first_token):
            rec.first_token = now
        rec.token_ids.extend(int(t) for t in new)
        if choice.get("finish_reason"):
            rec.finish_reason = str(choice["finish_reason"])
            rec.finished = now
    usage = chunk.get("usage")
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        rec.cached_tokens = int(details.get("cached_tokens") or 0)


async def _one(client: Any, url: str, rec: RequestRecord, t0: float, timeout: float) -> None:
    r = rec.spec
    await asyncio.sleep(max(0.0, r.arrival_s - (time.perf_counter() - t0)))
    rec.submitted = time.perf_counter() - t0
    rec.engine_id = f"cmpl-{r.request_id}-0"
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url + "/v1/completions", json=completion_body(r),
                                     headers={"X-Request-Id": r.request_id}) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")[:200]
                    rec.error = f"HTTP {resp.status_code}: {text}"
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    apply_chunk(rec, json.loads(data), time.perf_counter() - t0)
    except TimeoutError:
        rec.error = f"timed out after {timeout:.0f} s"
    except Exception as exc:  # noqa: BLE001 -- any transport error fails this request, recorded
        rec.error = f"{type(exc).__name__}: {exc}"
    if rec.error:
        rec.finish_reason = rec.finish_reason or "error"


async def replay(url: str, records: dict[str, RequestRecord], request_timeout: float,
                 progress: bool = True) -> float:
    """Send every request at its arrival time; returns t0 (perf_counter at the start)."""
    import httpx

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(records), desc="requests", unit="req", file=sys.stderr, leave=False)
    limits = httpx.Limits(max_connections=len(records) + 1, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout), limits=limits,
                                 trust_env=False) as client:
        t0 = time.perf_counter()

        async def tracked(rec: RequestRecord) -> None:
            await _one(client, url, rec, t0, request_timeout)
            if bar is not None:
                bar.update(1)

        try:
            await asyncio.gather(*(tracked(rec) for rec in records.values()))
        finally:
            if bar is not None:
                bar.close()
    return t0


def _metric(text: str, name: str) -> float:
    """Sum of a Prometheus sample over its label sets (0 when absent)."""
    pat = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", re.M)
    return float(sum(float(m.group(2)) for m in pat.finditer(text)))


def _tree_cpu(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total
    except psutil.NoSuchProcess:
        return 0.0


def _server_env(cfg: RunConfig, trace_path: Path | None, model: Path) -> dict[str, str]:
    import hybridmem

    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # see vllm_run.run_serving
    env.setdefault("OMP_NUM_THREADS", "1")
    # the plugin the server loads must be this hybridmem, not another installed copy
    root = str(Path(hybridmem.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    for k in (ENV_TRACE, ENV_TRACE_META, "HYBRIDMEM_ORG_GRID", "HYBRIDMEM_POISON_VLLM_STATE"):
        env.pop(k, None)
    env.update(org_env(cfg, model))  # the grid and poison check reach the engine core
    # The worker runs inside the engine-core process (vLLM's uni-process executor) for every
    # --org: S0-S2/D0 need it (the StateTable is process-wide), and --org vllm then has the same
    # process layout, so the arms compare like for like (and one vLLM import less, ~10 s).
    # vLLM-CPU replaces "uni" by its multiprocess executor unless this is 0; the API server
    # still starts the engine core as its own process.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if trace_path is not None:
        env[ENV_TRACE] = str(trace_path)
        env[ENV_TRACE_META] = json.dumps(
            {"seed": cfg.seed, "driver": "http", "arrivals": arrivals_text(cfg),
             **({"budget": cfg.budget} if cfg.budget is not None else {}),
             "workload": {"requests": cfg.requests, "rate": cfg.rate, "share": cfg.share,
                          "isolate": cfg.isolate}})
    return env


def _engine_ids_from_trace(trace_path: Path, records: dict[str, RequestRecord]) -> None:
    from hybridmem.engines.trace_sink import read_trace
    from hybridmem.events import EventKind

    _, events = read_trace(trace_path)
    seen = {str(e["request_id"]) for e in events if e["kind"] == int(EventKind.WAITING_ENTRY)}
    for rec in records.values():
        prefix = rec.engine_id + "-"
        match = [s for s in seen if s.startswith(prefix) and len(s) == len(prefix) + 8]
        if len(match) == 1:
            rec.engine_id = match[0]


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (and SIGHUP: the terminal closed) raise SystemExit(128 + signal) meanwhile, so
    ``with server`` still stops the server (Python's default action would end the process and
    orphan it). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_143(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, exit_143) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_serving_http(cfg: RunConfig, progress: bool = True, start_timeout: float = 300.0,
                     request_timeout: float = 600.0) -> RunResult:
    """One serving run through ``vllm serve``; writes what :func:`run_serving` writes, plus
    ``server.log``. The server is stopped (SIGINT, then killed) on every exit path."""
    cfg.check()
    if cfg.arrivals != "wall":
        raise ValueError("arrivals by engine step need the in-process driver: over HTTP the "
                         "driver cannot see the server's steps")
    if not start_timeout > 0 or not request_timeout > 0:
        raise ValueError(f"timeouts must be > 0 s, got start {start_timeout}, "
                         f"request {request_timeout}")
    model, workload, out, manifest, trace_path = prepare_run(cfg)
    settings = ServerSettings(
        model=model, dtype=cfg.dtype, seed=cfg.seed, max_model_len=cfg.max_model_len,
        cap=cfg.cap, prefix_caching=cfg.prefix_caching, kv_blocks=cfg.kv_blocks,
        kv_cache_bytes=cfg.kv_cache_bytes, extra_args=org_server_args(cfg, model),
        chunk_tokens=cfg.chunk_tokens,
    )
    records = {r.request_id: RequestRecord(r) for r in workload.requests}
    server = VllmServer(settings, out / SERVER_LOG, _server_env(cfg, trace_path, model))
    with _sigterm_exits(), server:
        server.start()
        assert server.proc is not None
        init_s = server.wait_ready(start_timeout)
        version = json.loads(server.get("/version")).get("version", "")
        preempt0 = _metric(server.get("/metrics").decode(), "vllm:num_preemptions_total")
        cpu0 = _tree_cpu(server.proc.pid) + time.process_time()
        t0 = asyncio.run(replay(server.url, records, request_timeout, progress))
        cpu_s = _tree_cpu(server.proc.pid) + time.process_time() - cpu0
        preemptions = int(_metric(server.get("/metrics").decode(), "vllm:num_preemptions_total")
                          - preempt0)
        rc = server.stop()
    ledger = time.perf_counter() - t0
    if trace_path is not None and trace_path.exists():
        _engine_ids_from_trace(trace_path, records)
    failed = [r for r in records.values() if r.error]
    summary = summarize(cfg, records, ledger, init_s, trace_path, preemptions,
                        engine_version=str(version), driver="http")
    summary["arrivals"] = arrivals_text(cfg)
    summary["engine_steps"] = None  # counted only when arrivals go by engine step
    summary["cpu_s"] = cpu_s
    summary["throughput_cpu_tok_s"] = summary["output_tokens"] / cpu_s if cpu_s > 0 else None
    summary["server_exit_code"] = rc
    summary["server_log"] = str(out / SERVER_LOG)
    summary["request_errors"] = {r.spec.request_id: r.error for r in failed}
    summary.update(org_summary(cfg, None, _server_violation(out / SERVER_LOG)))
    if cfg.org != "vllm" and trace_path is not None and trace_path.exists():
        from hybridmem.engines.trace_sink import read_trace

        meta, _ = read_trace(trace_path)
        summary["budget_bytes"] = meta.get("budget_bytes")
        summary["org_plan"] = {k: meta.get(k) for k in (
            "organization", "budget", "budget_bytes", "attention_grid_tokens",
            "recurrent_grid_tokens", "capacity", "num_block_ids")}
        summary["state_storage"] = meta.get("state_storage")
    return write_run(out, summary, records, manifest)


def org_server_args(cfg: RunConfig, model: Path) -> tuple[str, ...]:
    """``vllm serve`` flags of organization mode (none for ``--org vllm``): the grid's block
    size, the uni-process executor (the worker shares the scheduler's StateTable), the
    scheduler seam, the settings as ``--additional-config`` (they reach the
    engine-core process) and async scheduling off."""
    settings = cfg.org_settings()
    grid = org_grid(cfg, model)
    if settings is None or grid is None:
        return ()
    from hybridmem.vllm_plugin.org_geometry import server_args
    from hybridmem.vllm_plugin.org_settings import SCHEDULER_QUALNAME as QUALNAME

    # the worker must run in the engine-core process: the StateTable is process-wide
    return (*server_args(grid), "--distributed-executor-backend", "uni",
            "--scheduler-cls", QUALNAME, "--additional-config",
            json.dumps(settings.as_config()), "--no-async-scheduling")


def _server_violation(log: Path) -> str | None:
    """The invariant violation the engine core logged before it stopped (None: none)."""
    from hybridmem.vllm_plugin.org_settings import VIOLATION_MARK

    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if VIOLATION_MARK in line:
            return line.split(VIOLATION_MARK, 1)[1].strip()
    return None

