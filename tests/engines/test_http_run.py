"""``hybridmem run --server``: vLLM's OpenAI server as a subprocess, the workload over HTTP.

Fast tests check the pieces without vLLM (the command binds loopback only, request bodies, stream
parsing, the server is always reaped). The ``vllm`` test starts a real server with the tiny model
and compares it with the in-process driver on the same workload.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hybridmem.engines.http_run import _metric, apply_chunk, completion_body
from hybridmem.engines.run_results import RequestRecord
from hybridmem.engines.vllm_server import (
    HOST,
    ServerSettings,
    VllmServer,
    free_port,
    server_command,
)
from hybridmem.errors import HybridMemError
from hybridmem.workload import WorkloadRequest

SETTINGS = ServerSettings(model=Path("/m"), dtype="float32", seed=3, max_model_len=512, cap=4,
                          prefix_caching=True, kv_blocks=10, kv_cache_bytes=1 << 20)


def _req(salt: str | None = None) -> WorkloadRequest:
    return WorkloadRequest(request_id="s3-r00001", arrival_s=0.5, prompt_token_ids=(5, 6, 7),
                           max_output_tokens=4, cache_salt=salt, context_id=0,
                           shared_prefix_tokens=2)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_server_command_binds_loopback_only_and_carries_the_settings() -> None:
    argv = server_command(SETTINGS, 4242)
    assert (HOST, _flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "127.0.0.1",
                                                                    "4242")
    assert argv.count("--host") == 1 and "0.0.0.0" not in argv
    assert (_flag(argv, "--max-num-seqs"), _flag(argv, "--max-model-len")) == ("4", "512")
    assert (_flag(argv, "--num-gpu-blocks-override"), _flag(argv, "--seed")) == ("10", "3")
    assert _flag(argv, "--kv-cache-memory-bytes") == str(1 << 20)
    assert "--enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert int(_flag(argv, "--shutdown-timeout")) > 0, "0 = abort: the engine core is killed " \
        "before its scheduler shuts down and the trace gets no END"
    off = server_command(replace(SETTINGS, prefix_caching=False, kv_blocks=None), 1)
    assert "--no-enable-prefix-caching" in off and "--num-gpu-blocks-override" not in off


def test_free_port_is_bindable_on_loopback() -> None:
    import socket

    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, port))


def test_completion_body_is_greedy_token_ids_with_salt_only_when_isolated() -> None:
    body = completion_body(_req())
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 4
    assert (body["temperature"], body["ignore_eos"], body["stream"]) == (0.0, True, True)
    assert body["return_token_ids"] and "cache_salt" not in body
    assert completion_body(_req("isolate-s3-r00001"))["cache_salt"] == "isolate-s3-r00001"


def test_stream_chunks_fold_into_the_record() -> None:
    rec = RequestRecord(_req())
    apply_chunk(rec, {"choices": [{"index": 0, "token_ids": [], "finish_reason": None}]}, 0.6)
    assert math.isnan(rec.first_token), "a chunk without tokens is not the first token"
    apply_chunk(rec, {"choices": [{"index": 0, "token_ids": [9], "finish_reason": None}]}, 0.7)
    apply_chunk(rec, {"choices": [{"index": 0, "token_ids": [8, 7],
                                   "finish_reason": "length"}]}, 0.9)
    apply_chunk(rec, {"choices": [], "usage": {"prompt_tokens": 3,
                                               "prompt_tokens_details": {"cached_tokens": 2}}},
                0.95)
    assert (rec.first_token, rec.finished, rec.finish_reason) == (0.7, 0.9, "length")
    assert (rec.token_ids, rec.cached_tokens) == ([9, 8, 7], 2)


def test_metric_sums_label_sets_and_ignores_lookalikes() -> None:
    text = ('# HELP vllm:num_preemptions_total x\n'
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
            'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0\n'
            'vllm:num_preemptions_created{engine="0"} 1.7e9\n')
    assert _metric(text, "vllm:num_preemptions_total") == 5.0
    assert _metric(text, "vllm:absent_total") == 0.0


def _fake(server: VllmServer, code: str) -> None:
    server.port = free_port()
    server._log = open(server.log_path, "wb")  # noqa: SIM115 (stop() closes it)
    server.proc = subprocess.Popen([sys.executable, "-c", code], stdout=server._log,
                                   stderr=subprocess.STDOUT, start_new_session=True)


def test_a_server_that_dies_at_start_is_one_error_naming_the_log(tmp_path: Path) -> None:
    server = VllmServer(SETTINGS, tmp_path / "server.log", dict(os.environ))
    _fake(server, "print('no such model', flush=True); raise SystemExit(3)")
    with server, pytest.raises(HybridMemError, match=r"exited with code 3 .*no such model"):
        server.wait_ready(timeout=30)


def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    server = VllmServer(SETTINGS, tmp_path / "server.log", dict(os.environ))
    _fake(server, "import time; time.sleep(60)")
    with server, pytest.raises(HybridMemError, match="not ready after 1 s"):
        server.wait_ready(timeout=1)


def test_stop_kills_the_whole_group_even_when_sigint_is_ignored(tmp_path: Path) -> None:
    server = VllmServer(SETTINGS, tmp_path / "server.log", dict(os.environ))
    # leader ignores SIGINT and has a child (an engine core stand-in) in its group
    _fake(server, "import signal, subprocess, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
                  "subprocess.Popen(['sleep', '60']); print('up', flush=True); time.sleep(60)")
    assert server.proc is not None
    pgid = server.proc.pid
    deadline = time.monotonic() + 20
    while b"up" not in server.log_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    t = time.monotonic()
    assert server.stop(grace=0.5) is None, "SIGINT was ignored: it had to be killed"
    assert time.monotonic() - t < 15
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # nothing of the group is left
    assert server.stop() is None  # idempotent


# a real vLLM server and an in-process engine on the same workload (~55 s): slow; the
# stand-in server tests above run by default, and the stop tests serve a real one too
@pytest.mark.slow
@pytest.mark.vllm
def test_server_run_matches_the_in_process_run(tiny_model: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from hybridmem.engines.http_run import run_serving_http
    from hybridmem.engines.trace_sink import read_trace
    from hybridmem.engines.vllm_run import RunConfig, run_serving
    from hybridmem.events import EventKind

    # limit 1,024 and 16 requests: the tiny model's vLLM blocks are 256 tokens, so only prompts
    # past 256 tokens on a context seen before can hit (7 such requests here, 3 of them at 12)
    base = RunConfig(model=str(tiny_model), requests=16, rate=6.0, share=1.0, seed=3,
                     max_model_len=1024, out=tmp_path / "x")
    http = run_serving_http(
        replace(base, out=tmp_path / "http", trace_dir=tmp_path / "tr"),
        progress=False, start_timeout=240, request_timeout=120)
    local = run_serving(replace(base, out=tmp_path / "local"), progress=False)
    s: dict[str, Any] = http.summary
    assert (s["requests"], s["completed"], s["driver"]) == (16, 16, "http"), s["request_errors"]
    assert s["server_exit_code"] == 0, "SIGINT must shut the server down cleanly"
    assert s["trace_verdict"]["accepted"], s["trace_verdict"]
    assert s["prefix_hit_tokens"] > 0, "share 1.0: later requests reuse cached prefixes"
    assert set(local.summary) <= set(s), "same summary keys as the in-process path"
    a = pq.read_table(http.results_path).to_pydict()
    b = pq.read_table(local.results_path).to_pydict()
    assert a.keys() == b.keys()
    assert a["request_id"] == b["request_id"]
    assert a["output_token_ids"] == b["output_token_ids"], "greedy outputs differ"
    # negative control: the outputs depend on the request, so answers served to the wrong
    # request, or the same answer to all, fail the comparison above (a state fault in the
    # served organization is test_org_serving's swap-members / stale-checkpoint controls)
    outs = [tuple(t) for t in b["output_token_ids"]]
    assert len(set(outs)) > 1, "every request got the same tokens: the comparison is blind"
    assert a["output_token_ids"] != b["output_token_ids"][1:] + b["output_token_ids"][:1]
    assert a["output_tokens"] == a["max_output_tokens"]
    assert all(t > 0 for t in a["ttft_s"])
    _, events = read_trace(s["trace_path"])
    entries = {e["request_id"] for e in events if e["kind"] == EventKind.WAITING_ENTRY}
    assert set(a["engine_request_id"]) == entries  # results map onto the trace's ids
    assert events[-1]["kind"] == EventKind.END
    assert (tmp_path / "http" / "server.log").stat().st_size > 0


# a driver that starts a stand-in server through VllmServer.start (the real path) and waits
_DRIVER = """
import os, sys, time
from pathlib import Path
import hybridmem.engines.vllm_server as vs
from hybridmem.engines.http_run import _sigterm_exits
vs.DIE_WITH_PARENT = sys.argv[2] == "arm"
vs.server_command = lambda s, port: [sys.executable, "-c", "import time; time.sleep(120)"]
server = vs.VllmServer(vs.ServerSettings(Path("/m"), "float32", 0, 512, 4, True, None, 1),
                       Path(sys.argv[1]), dict(os.environ))
with _sigterm_exits(), server:
    server.start()
    print(server.proc.pid, flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _killed_driver(tmp_path: Path, sig: int, arm: bool, wait_s: float = 10.0
                   ) -> tuple[int, bool]:
    """Start the driver, kill it with ``sig``; (server pid, server still alive ``wait_s``
    later)."""
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path / "server.log"),
                               "arm" if arm else "off"], stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    pid = int(driver.stdout.readline())
    assert _alive(pid)
    driver.send_signal(sig)
    driver.wait(timeout=30)
    deadline = time.monotonic() + wait_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid, _alive(pid)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=["SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_killed_driver_leaves_no_server_running(tmp_path: Path, sig: int) -> None:
    """``run --server`` killed by SIGTERM/SIGHUP stops its server through the context manager;
    killed by SIGKILL, the kernel's parent-death signal stops it."""
    _, alive = _killed_driver(tmp_path, sig, arm=True)
    assert not alive, f"the server outlived a driver killed by {signal.Signals(sig).name}"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_negative_control_without_the_parent_death_signal_sigkill_orphans(
        tmp_path: Path) -> None:
    """Control: without PR_SET_PDEATHSIG a SIGKILLed driver leaves the server running (so the
    test above can fail)."""
    pid, alive = _killed_driver(tmp_path, signal.SIGKILL, arm=False, wait_s=2.0)
    try:
        assert alive
    finally:
        os.killpg(pid, signal.SIGKILL)  # the orphan this test started
