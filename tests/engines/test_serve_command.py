"""`hybridmem serve`: the plain vLLM command, its validation, the shutdown grace and the
/metrics collector -- everything that runs without starting a server (the servers are in
test_serve_stops.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from hybridmem.cli.main import main
from hybridmem.events import Cause, Event, EventKind, StateKind


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, str],
                                                                          list[str]]:
    assert main(["serve", "--print-command", *argv]) == 0  # before `--`: after it, vLLM's
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    words = shlex.split(out)
    env: dict[str, str] = {}
    while words and re.match(r"[A-Z][A-Z0-9_]*=", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_s2_command_routes_every_decision_through_the_organization(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env, argv = printed(["--model", str(tiny_model), "--org", "S2", "--budget", "b20",
                         "--trace", str(tmp_path / "t.hmt"), "--port", "8123", "--",
                         "--max-num-seqs", "4"], capsys)
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HYBRIDMEM_ORG_GRID": "64",
                   "HYBRIDMEM_TRACE": str(tmp_path / "t.hmt")}
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--model") == str(tiny_model) and flag(argv, "--port") == "8123"
    assert flag(argv, "--block-size") == "64" and flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--scheduler-cls") == "hybridmem.vllm_plugin.org_scheduler.OrgScheduler"
    assert flag(argv, "--distributed-executor-backend") == "uni"
    assert "--no-async-scheduling" in argv and "--enable-prefix-caching" in argv
    assert json.loads(flag(argv, "--additional-config")) == {
        "hybridmem": {"org": "S2", "budget": "b20"}}
    assert argv[-2:] == ["--max-num-seqs", "4"]  # passed through, after hybridmem's flags
    # b20 = 55 pages: 56 block ids (0 is vLLM's null block) x 64 tokens x 512 B x 4 KV layers
    assert flag(argv, "--kv-cache-memory-bytes") == str(56 * 64 * 512 * 4)
    _, argv = printed(["--model", str(tiny_model), "--", "--kv-cache-memory-bytes=1GiB"],
                      capsys)
    assert argv.count("--kv-cache-memory-bytes") == 0 and argv[-1] == "--kv-cache-memory-bytes=1GiB"


def test_d0_runs_on_its_native_unit_and_vllm_gets_no_organization(
        tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env, argv = printed(["--model", str(tiny_model), "--org", "D0", "--budget", "b10",
                         "--attention-fraction", "0.7"], capsys)
    assert env["HYBRIDMEM_ORG_GRID"] == "16" and flag(argv, "--block-size") == "16"
    assert json.loads(flag(argv, "--additional-config"))["hybridmem"] == {
        "org": "D0", "budget": "b10", "attention_fraction": 0.7}
    env, argv = printed(["--model", str(tiny_model), "--org", "vllm"], capsys)
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert "--scheduler-cls" not in argv and "--block-size" not in argv


def _without(argv: list[str], *flags: str) -> list[str]:
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        else:
            out.append(word)
    return out


def test_the_readme_recipe_is_what_print_command_prints(
        tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's worked example, flag for flag (the model path aside); a README edited
    without the command, or the command without the README, fails here."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("**Serving from vLLM itself**", 1)[1].split("```sh", 1)[1]
    words = shlex.split(block.split("```", 1)[0].replace("\\\n", " "))
    readme_env: dict[str, str] = {}
    while re.match(r"[A-Z][A-Z0-9_]*=", words[0]):
        key, value = words.pop(0).split("=", 1)
        readme_env[key] = value
    env, argv = printed(["--model", str(tiny_model), "--org", "S2", "--budget", "b40",
                         "--trace", "t.hmt", "--port", "8000"], capsys)
    assert {**env, "HYBRIDMEM_TRACE": "t.hmt"} == readme_env
    assert words[0] == "python" and argv[0].endswith("python")
    drop = ("--model", "--served-model-name")
    assert _without(words[1:], *drop) == _without(argv[1:], *drop)


def test_the_command_spells_the_plugins_own_names() -> None:
    from hybridmem.engines import serve_command
    from hybridmem.vllm_plugin import org_geometry, org_settings

    assert serve_command.GRID_ENV == org_geometry.GRID_ENV
    assert serve_command.SCHEDULER_QUALNAME == org_settings.SCHEDULER_QUALNAME
    assert serve_command.ORG_NAMES == org_settings.ORG_NAMES


@pytest.mark.parametrize("argv, needle", [
    (["--org", "S9"], "argument --org: invalid choice: 'S9'"),
    (["--budget", "b0"], "budget label must be b1 or larger, got 'b0'"),
    (["--budget", "lots"], "bad budget 'lots'"),
    (["--org", "vllm", "--budget", "b40"], "--budget needs an organization"),
    (["--org", "vllm", "--check-invariants"], "--check-invariants needs an organization"),
    (["--org", "D0"], "D0 needs an attention fraction"),
    (["--port", "0"], "--port: 0 is outside [1, 65,535]"),
    (["--port", "x"], "argument --port"),
    (["--host", ""], "--host '': expected an address"),
    (["--trace", ""], "argument --trace: an empty path"),
    (["--", "--block-size", "16"], "--block-size is set by hybridmem serve"),
    (["--", "--additional-config={}"], "--additional-config is set by hybridmem serve"),
    (["--", "--print-command"], "put it before `--`"),
    (["--model", "falcon-h1-7b"], "architecture-only config"),
    (["--model", "/nonexistent"], "no config.json there"),
], ids=["org", "budget-label", "budget-text", "vllm-budget", "vllm-checks", "d0-fraction",
        "port", "port-text", "host", "trace-empty", "owned-flag", "owned-flag-eq",
        "print-after-dashes", "shipped-name", "no-model"])
def test_bad_inputs_fail_in_one_line_with_exit_2(argv: list[str], needle: str,
                                                  tiny_model: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = [] if "--model" in argv else ["--model", str(tiny_model)]
    assert exit_code(["serve", "--print-command", *model, *argv]) == 2
    cap = capsys.readouterr()
    assert needle in cap.err and cap.err.count("\n") == 1, cap.err
    assert cap.out == ""


def test_a_trace_directory_and_a_bad_grace_are_refused(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert exit_code(["serve", "--model", str(tiny_model), "--trace", str(tmp_path),
                      "--print-command"]) == 2
    assert "is a directory" in capsys.readouterr().err
    monkeypatch.setenv("HYBRIDMEM_SHUTDOWN_GRACE_S", "nan")
    assert exit_code(["serve", "--model", str(tiny_model), "--print-command"]) == 2
    assert "HYBRIDMEM_SHUTDOWN_GRACE_S='nan'" in capsys.readouterr().err


# -- the shutdown grace -----------------------------------------------------------------------
def test_a_traced_engine_core_gets_the_grace_and_an_untraced_one_vllms_deadline() -> None:
    from hybridmem.vllm_plugin.shutdown import process_timeout

    assert process_timeout(0, traced=True, grace=30) == 30  # vLLM's "abort": kill at once
    assert process_timeout(None, traced=True, grace=30) == 30  # vLLM's 5-s default
    assert process_timeout(60, traced=True, grace=30) == 60  # a longer drain stays
    # negative controls: untraced, or the grace switched off, keep vLLM's own deadline
    assert process_timeout(0, traced=False, grace=30) == 0
    assert process_timeout(0, traced=True, grace=0) == 0


@pytest.mark.vllm
def test_the_wrapper_reaches_vllms_process_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's process manager looks the function up in its module at shutdown: the wrapped
    one answers there, with the trace set and not."""
    from vllm.v1.engine import utils

    from hybridmem.vllm_plugin import shutdown

    monkeypatch.setattr(utils, "get_engine_process_shutdown_timeout",
                        utils.get_engine_process_shutdown_timeout)  # restored afterwards
    assert shutdown.install() and shutdown.install()  # idempotent
    monkeypatch.setenv("HYBRIDMEM_TRACE", "/tmp/x.hmt")
    monkeypatch.delenv("HYBRIDMEM_SHUTDOWN_GRACE_S", raising=False)
    assert utils.get_engine_process_shutdown_timeout(0, 0) == shutdown.DEFAULT_GRACE_S
    monkeypatch.setenv("HYBRIDMEM_SHUTDOWN_GRACE_S", "0")
    assert utils.get_engine_process_shutdown_timeout(0, 0) == 0
    monkeypatch.delenv("HYBRIDMEM_SHUTDOWN_GRACE_S")
    monkeypatch.delenv("HYBRIDMEM_TRACE")
    assert utils.get_engine_process_shutdown_timeout(0, 0) == 0


def _engine_core_stand_in(path: str, ready: Any) -> None:
    """An engine core as vLLM's process manager sees it: a traced process that, on SIGTERM,
    takes a second to shut its scheduler down (which writes END) and then exits."""
    import signal
    import time

    from tracer import TraceWriter

    writer = TraceWriter(path, {"organization": "S2"}, handle_signals=False)
    for i in range(10):
        writer.on_event(Event(EventKind.FINISH, request_id=f"r{i}"))

    def stop(signum: int, frame: Any) -> None:
        time.sleep(1.0)  # abort requests, tear the worker down, then the scheduler's shutdown
        writer.close()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    ready.set()
    while True:
        time.sleep(0.1)


@pytest.mark.vllm
@pytest.mark.parametrize("grace", ["default", "0"])
def test_vllms_process_manager_lets_a_traced_engine_core_write_end(
        grace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own stop sequence (utils.shutdown: SIGTERM, wait the deadline, SIGKILL) against a
    stand-in engine core: with the plugin's grace the trace is accepted; with vLLM's deadline
    (grace 0, the negative control) the stand-in is killed first and END is missing."""
    import multiprocessing

    from vllm.v1 import utils as v1_utils
    from vllm.v1.engine import utils

    from hybridmem.engines.trace_sink import verify_trace
    from hybridmem.vllm_plugin import shutdown

    monkeypatch.setattr(utils, "get_engine_process_shutdown_timeout",
                        utils.get_engine_process_shutdown_timeout)  # restored afterwards
    shutdown.install()
    trace = tmp_path / "t.hmt"
    monkeypatch.setenv("HYBRIDMEM_TRACE", str(trace))
    if grace != "default":
        monkeypatch.setenv("HYBRIDMEM_SHUTDOWN_GRACE_S", grace)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_engine_core_stand_in, args=(str(trace), ready), name="EngineCore")
    proc.start()
    assert ready.wait(60)
    # what CoreEngineProcManager.shutdown does with --shutdown-timeout 0 (vLLM's default)
    v1_utils.shutdown([proc], timeout=utils.get_engine_process_shutdown_timeout(0, 0))
    proc.join(10)
    verdict = verify_trace(trace)
    if grace == "default":
        assert proc.exitcode == 0 and verdict["accepted"], verdict
    else:
        assert proc.exitcode == -9, proc.exitcode
        assert verdict["reason"].startswith("not accepted: END missing"), verdict


# -- /metrics -----------------------------------------------------------------------------------
def _organization() -> object:
    from hybridmem.cli.models import geometry
    from hybridmem.vllm_plugin.org_settings import OrgSettings, build_org, plan_org

    plan = plan_org(OrgSettings("S2", "b20").check(), geometry("tiny"), 64)
    return plan, build_org(plan, None)


def test_the_collector_serves_the_engine_cores_snapshot(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hybridmem.vllm_plugin import org_metrics

    monkeypatch.setenv(org_metrics.DIR_ENV, str(tmp_path))
    plan, org = _organization()
    reporter = org_metrics.Reporter(org_metrics.snapshot_path(4242))
    reporter.attach(org, None, plan)
    events = [Event(EventKind.LOSS, cause=Cause.ALLOCATION, state_kind=StateKind.ATTENTION),
              Event(EventKind.LOSS, cause=Cause.ALLOCATION, state_kind=StateKind.ATTENTION),
              Event(EventKind.LOSS, cause=Cause.SLAB_RECLAIM, state_kind=StateKind.RECURRENT),
              Event(EventKind.PUBLICATION, state_kind=StateKind.RECURRENT),
              Event(EventKind.ADOPTION, depth=128), Event(EventKind.ADOPTION, depth=0),
              Event(EventKind.FINISH)]
    for e in events:
        reporter.on_event(e)
    reporter.write(force=True)
    registry = CollectorRegistry()
    registry.register(org_metrics.Collector(4242))  # type: ignore[arg-type]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(generate_latest(registry).decode())
               for s in fam.samples}
    cap = plan.capacity
    assert samples[("hybridmem:units_capacity", (("pool", "shared"),))] == cap
    assert samples[("hybridmem:units_free", (("pool", "shared"),))] == cap  # nothing held
    assert samples[("hybridmem:units_in_use", (("pool", "shared"),))] == 0
    assert samples[("hybridmem:losses_total", (("cause", "allocation"),
                                               ("state_kind", "attention")))] == 2
    assert samples[("hybridmem:losses_total", (("cause", "slab_reclaim"),
                                               ("state_kind", "recurrent")))] == 1
    assert samples[("hybridmem:adoptions_total", ())] == 2
    assert samples[("hybridmem:adopted_tokens_total", ())] == 128
    assert samples[("hybridmem:info", (("budget", "b20"), ("grid_tokens", "64"),
                                       ("interval_tokens", "64"), ("organization", "S2")))] == 1
    # another server's scrape (another pid) sees nothing of this engine core
    other = CollectorRegistry()
    other.register(org_metrics.Collector(4243))  # type: ignore[arg-type]
    assert b"hybridmem:" not in generate_latest(other)
    reporter.close()
    assert not org_metrics.snapshot_path(4242).exists()


def test_the_reporter_is_off_outside_a_vllm_engine_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridmem.vllm_plugin import org_metrics

    assert not org_metrics.in_engine_core()
    assert org_metrics.engine_core_reporter() is None  # in-process engines: no snapshot files
