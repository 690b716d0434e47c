"""Clean stops: a traced server or run interrupted mid-service leaves an accepted trace (END
written) within the shutdown budget, or a verdict that says what was lost; and a served run's
/metrics agree with its trace.

One test per entry point, each a real vLLM process on the tiny model (30-100 s each on a shared
2-core box, hence slow):

    hybridmem serve (S2)          SIGINT   accepted; /metrics == the trace's counts
    plain vLLM + plugin (printed  SIGTERM  accepted (the plugin's shutdown grace)
      by --print-command)         SIGTERM  with HYBRIDMEM_SHUTDOWN_GRACE_S=0: END missing
                                           (negative control: vLLM's own deadline kills the
                                           engine core before its scheduler shuts down)
    hybridmem run (in process)    SIGINT   exit 130, accepted, no summary.json
                                  SIGKILL  END missing (negative control), no summary.json
    hybridmem run --server        SIGTERM  exit 143, accepted, no summary.json, no server left
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hybridmem.events import Cause, EventKind, StateKind

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="signals")]

ROOT = Path(__file__).resolve().parents[2]
STOP_BUDGET_S = 60.0  # SIGINT/SIGTERM to exit, under load (the grace is 30 s)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    for k in ("HYBRIDMEM_TRACE", "HYBRIDMEM_ORG_GRID", "HYBRIDMEM_SHUTDOWN_GRACE_S"):
        env.pop(k, None)
    env.update(extra)
    return env


def _hybridmem(*args: str) -> list[str]:
    return [sys.executable, "-m", "hybridmem.cli.main", *args]


def _free_port() -> int:
    from hybridmem.engines.vllm_server import free_port

    return free_port()


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return bytes(r.read())


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 (loopback)
        return dict(json.loads(r.read()))


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if _get(f"http://127.0.0.1:{port}/health", 2.0) is not None:
                return
        except OSError:
            time.sleep(1.0)
    pytest.fail(f"server not ready after {timeout} s")


def _prompts(n: int, seed: int = 7) -> list[list[int]]:
    """Token-id prompts: a 256-token prefix shared by all, then a private tail."""
    import random

    rng = random.Random(seed)
    shared = [rng.randrange(4, 500) for _ in range(256)]
    return [shared + [rng.randrange(4, 500) for _ in range(64 + 32 * i)] for i in range(n)]


def _complete(port: int, prompts: list[list[int]], max_tokens: int = 16) -> None:
    """Send every prompt at once (threads), wait for all answers."""
    errors: list[BaseException] = []

    def one(p: list[int]) -> None:
        try:
            out = _post(f"http://127.0.0.1:{port}/v1/completions",
                        {"model": "tiny", "prompt": p, "max_tokens": max_tokens,
                         "temperature": 0, "ignore_eos": True})
            assert out["choices"][0]["finish_reason"] == "length", out
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _stop(proc: subprocess.Popen[bytes], sig: int) -> tuple[int, float, list[str]]:
    """Signal the leader; (its exit code, seconds to exit, processes of its group still alive
    10 s later). The caller kills the group afterwards in any case."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(timeout=STOP_BUDGET_S)
    took = time.monotonic() - t0
    print(f"\nstop: signal {sig} -> exit {rc} in {took:.1f} s")  # shown with pytest -s
    return rc, took, _group_left(proc.pid)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Leave nothing of the server behind, whatever the test found."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _group_left(pgid: int, wait_s: float = 10.0) -> list[str]:
    """Live (not zombie) processes of the server's process group after ``wait_s`` seconds
    (a zombie is dead; this container's init may be slow to reap it)."""
    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "status", "name"]):
            try:
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {p.info['name']}")
            except (ProcessLookupError, psutil.Error):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _verdict(trace: Path) -> dict[str, Any]:
    from hybridmem.engines.trace_sink import verify_trace

    return verify_trace(trace)


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = _get(f"http://127.0.0.1:{port}/metrics").decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("hybridmem:")}


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=ROOT)


def test_hybridmem_serve_sigint_accepts_the_trace_and_metrics_match_it(
        tiny_model: Path, tmp_path: Path) -> None:
    from hybridmem.engines.trace_sink import read_trace

    trace, log, port = tmp_path / "s2.hmt", tmp_path / "server.log", _free_port()
    proc = _start(_hybridmem("serve", "--model", str(tiny_model), "--org", "S2", "--budget",
                             "b20", "--trace", str(trace), "--port", str(port), "--",
                             "--max-num-seqs", "4", "--max-model-len", "1024",
                             "--served-model-name", "tiny"), _env(), log)
    try:
        _wait_ready(proc, port, log)
        prompts = _prompts(8)
        _complete(port, prompts)
        m = _metrics(port)
        rc, took, left = _stop(proc, signal.SIGINT)
    finally:
        _kill_group(proc)
    assert rc == 0 and took < STOP_BUDGET_S and not left, (rc, took, left)
    from hybridmem.vllm_plugin.org_metrics import snapshot_path

    assert not snapshot_path(proc.pid).exists(), "the engine core removes its snapshot"
    verdict = _verdict(trace)
    assert verdict["accepted"], verdict
    meta, events = read_trace(trace)
    assert meta["organization"] == "S2"
    kinds = Counter(e["kind"] for e in events)
    # the served counters are the trace's, event for event
    adoptions = [e for e in events if e["kind"] == EventKind.ADOPTION]
    assert m[("hybridmem:adoptions_total", ())] == len(adoptions) >= len(prompts)
    assert m[("hybridmem:adopted_tokens_total", ())] == sum(e["depth"] for e in adoptions) > 0
    losses = Counter((Cause(e["cause"]).name.lower(), StateKind(e["state_kind"]).name.lower())
                     for e in events if e["kind"] == EventKind.LOSS)
    served = {k[1]: v for k, v in m.items() if k[0] == "hybridmem:losses_total"}
    assert served == {(("cause", c), ("state_kind", s)): n for (c, s), n in losses.items()}
    assert losses[("allocation", "attention")] > 0, "b20 with 8 requests must reclaim"
    pubs = Counter(StateKind(e["state_kind"]).name.lower()
                   for e in events if e["kind"] == EventKind.PUBLICATION)
    assert {k[1][0][1]: v for k, v in m.items()
            if k[0] == "hybridmem:publications_total"} == dict(pubs)
    assert m[("hybridmem:finished_total", ())] == kinds[EventKind.FINISH] == len(prompts)
    pool = (("pool", "shared"),)
    cap = meta["capacity"]["pages"]
    assert m[("hybridmem:units_capacity", pool)] == cap
    assert m[("hybridmem:units_in_use", pool)] == 0  # idle: every request finished
    assert m[("hybridmem:units_free", pool)] + m[("hybridmem:units_cached", pool)] == cap
    assert m[("hybridmem:units_cached", pool)] > 0  # the published prefixes stay cached


@pytest.mark.parametrize("grace", ["default", "0"])
def test_plain_vllm_with_the_plugin_sigterm(grace: str, tiny_model: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The printed command, run as a user would; grace 0 is the negative control."""
    from hybridmem.cli.main import main

    trace, log, port = tmp_path / "plain.hmt", tmp_path / "server.log", _free_port()
    assert main(["serve", "--print-command", "--model", str(tiny_model), "--org", "S2",
                 "--trace", str(trace), "--port", str(port), "--", "--max-num-seqs", "4",
                 "--served-model-name", "tiny"]) == 0
    words = shlex.split(capsys.readouterr().out)
    env = _env()
    while "=" in words[0] and not words[0].startswith("/"):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if grace != "default":
        env["HYBRIDMEM_SHUTDOWN_GRACE_S"] = grace
    proc = _start(words, env, log)
    try:
        _wait_ready(proc, port, log)
        _complete(port, _prompts(3))
        rc, took, left = _stop(proc, signal.SIGTERM)
    finally:
        _kill_group(proc)
    assert took < STOP_BUDGET_S and not left, (took, left)
    verdict = _verdict(trace)
    if grace == "default":
        assert rc == 0 and verdict["accepted"], verdict
    else:  # vLLM's own deadline: the engine core is killed before its scheduler's shutdown
        assert not verdict["accepted"] and verdict["reason"].startswith(
            "not accepted: END missing"), verdict
        assert verdict["recovered_records"] > 0  # what was written before the kill is kept


def _run_until_serving(args: list[str], out: Path, trace: Path) -> subprocess.Popen[bytes]:
    """Start `hybridmem run` and return once its trace exists and requests are being served."""
    out.mkdir(parents=True, exist_ok=True)
    # a stale summary from an earlier run that claims an accepted trace must not survive
    (out / "summary.json").write_text(json.dumps({"trace_verdict": {"accepted": True}}))
    proc = _start(_hybridmem("run", "--model", "tiny", "--out", str(out), "--requests", "400",
                             "--rate", "20", "--quiet", *args), _env(), out.parent / "run.log")
    t0 = time.monotonic()
    while not (trace.exists() and trace.stat().st_size > 4096):  # a packet of events on disk
        if proc.poll() is not None or time.monotonic() - t0 > 300:
            _kill_group(proc)
            pytest.fail(f"run ended or stalled before serving: "
                        f"{(out.parent / 'run.log').read_text()[-2000:]}")
        time.sleep(0.5)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_hybridmem_run_in_process_stop(sig: int, tmp_path: Path) -> None:
    out = tmp_path / "run"
    trace = out / "trace" / "trace.hmt"
    proc = _run_until_serving([], out, trace)
    try:
        rc, took, left = _stop(proc, sig)
    finally:
        _kill_group(proc)
    assert took < STOP_BUDGET_S and not left, (took, left)
    assert not (out / "summary.json").exists(), "a stopped run must not keep a summary"
    verdict = _verdict(trace)
    if sig == signal.SIGINT:
        assert rc == 130 and verdict["accepted"], (rc, verdict)
    else:  # negative control: nothing can run after SIGKILL
        assert rc == -signal.SIGKILL and verdict["reason"].startswith(
            "not accepted: END missing"), verdict


def test_hybridmem_run_server_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "run"
    trace = out / "trace" / "trace.hmt"
    proc = _run_until_serving(["--server"], out, trace)
    try:
        rc, took, left = _stop(proc, signal.SIGTERM)
    finally:
        _kill_group(proc)
    assert rc == 143 and took < STOP_BUDGET_S and not left, (rc, took, left)
    assert not (out / "summary.json").exists(), "a stopped run must not keep a summary"
    verdict = _verdict(trace)
    assert verdict["accepted"], verdict
    log = (out / "server.log").read_text()
    assert "[shutdown] API server" in log  # the server was stopped, not killed with the group
