"""Hostile inputs under a memory limit: endless devices as specs and configs, a sparse 8 GiB
spec, a campaign seed range of 10^9 and a KV-event with millions of hashes must be refused in
one line (exit 2) by validation, not by running out of memory.

The calls run in a child process (``tests/memory_limit_child.py``) whose address space is capped
with ``RLIMIT_AS`` at its measured import baseline (the CLI and torch imported) plus
``HEADROOM`` (2 GiB), each call under an alarm and the child under a timeout. A read or
allocation without a bound fails there: Python raises MemoryError, which the CLI would report as
"input too large to hold in memory", so that message fails the check too (as does "unexpected").
The negative control runs the same child with the input reader's cap removed and shows that
``campaign /dev/zero`` then fails the check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[1]
HEADROOM = 2 << 30
SPEC = ('[campaign]\nname = "t"\nmodel = {model}\nrequests = 10\n'
        '[grid]\norg = ["S2"]\nbudget = ["b63"]\nseeds = {seeds}\n')
MEMORY_MESSAGE = "too large to hold in memory"


def _inputs(d: Path) -> dict[str, str]:
    f: dict[str, str] = {}
    for dev in ("zero", "urandom"):
        (d / f"cfg{dev}").mkdir()
        (d / f"cfg{dev}" / "config.json").symlink_to(f"/dev/{dev}")
        f[f"cfg_{dev}"] = str(d / f"cfg{dev}")
    (d / "seedrange.toml").write_text(SPEC.format(
        model='"falcon-h1-7b"', seeds="{start = 0, count = 1000000000}"))
    f["seedrange"] = str(d / "seedrange.toml")
    (d / "devmodel.toml").write_text(SPEC.format(model=json.dumps(f["cfg_zero"]), seeds="[1]"))
    f["devmodel"] = str(d / "devmodel.toml")
    with open(d / "sparse.toml", "wb") as fh:  # 8 GiB of holes: a regular file, no disk used
        fh.truncate(8 << 30)
    f["sparse"] = str(d / "sparse.toml")
    (d / "hashes.msgpack").write_bytes(msgpack.packb(
        [0.0, [["BlockStored", [1] * 5_000_000, None, [], 16, None, "GPU"]]]))
    f["hashes"] = str(d / "hashes.msgpack")
    f["out"] = str(d / "out")
    f["imported"] = str(d / "imported.parquet")
    return f


def _cases(f: dict[str, str]) -> list[dict[str, object]]:
    out = f["out"]
    cases = {
        "campaign-spec-dev-zero": ["campaign", "/dev/zero", "--out", out],
        "campaign-spec-dev-urandom": ["campaign", "/dev/urandom", "--out", out],
        "campaign-spec-sparse-8GiB": ["campaign", f["sparse"], "--out", out],
        "campaign-seed-range-1e9": ["campaign", f["seedrange"], "--out", out],
        "campaign-model-config-dev-zero": ["campaign", f["devmodel"], "--out", out],
        "plan-config-dev-zero": ["plan", "--model", f["cfg_zero"], "--budget", "b63"],
        "plan-config-dev-urandom": ["plan", "--model", f["cfg_urandom"], "--budget", "b63"],
        "sim-config-dev-zero": ["sim", "--model", f["cfg_zero"], "--out", out],
        "run-config-dev-urandom": ["run", "--model", f["cfg_urandom"], "--out", out],
        "continuation-cases-dev-zero": ["continuation", "--cases-file", "/dev/zero", "--out",
                                        out],
        "sim-calibrate-dev-urandom": ["sim", "calibrate", "/dev/urandom"],
        "stats-table-dev-zero": ["stats", "contrast", "/dev/zero", "--num", "a", "--den", "b"],
        "import-vllm-5M-hashes": ["lineage", "import-vllm", f["hashes"], f["imported"]],
    }
    return [{"name": k, "argv": v, "timeout": 120} for k, v in cases.items()]


# controls run in the same child: the limit leaves room for a valid call, and a refusal of a
# plain bad value passes the check (it is not so tight that every call fails for want of memory)
CONTROLS = [{"name": "control-plan", "argv": ["plan", "--model", "falcon-h1-7b", "--budget",
                                              "b63"]},
            {"name": "control-bad-requests", "argv": ["sim", "--requests", "0", "--out",
                                                      "unused"]}]


def _run_child(tmp_path: Path, cases: list[dict[str, object]], *flags: str) -> dict:
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.memory_limit_child", str(HEADROOM),
         str(tmp_path / "cases.json"), *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def refused_by_validation(case: dict) -> bool:
    """Exit 2 with exactly one line that is a validation message, not an exhausted memory."""
    lines = case["stderr"].splitlines()
    return (case["code"] == 2 and len(lines) == 1 and MEMORY_MESSAGE not in lines[0]
            and ": unexpected " not in lines[0])


def test_hostile_inputs_are_refused_within_the_memory_limit(tmp_path):
    f = _inputs(tmp_path)
    result = _run_child(tmp_path, _cases(f) + CONTROLS)
    assert result["limit"] - result["baseline"] == HEADROOM
    by_name = {c["name"]: c for c in result["cases"]}
    assert by_name.pop("control-plan")["code"] == 0, result
    bad = [c for c in by_name.values() if not refused_by_validation(c)]
    assert not bad, bad
    assert not Path(f["out"]).exists() and not Path(f["imported"]).exists()
    assert "5000000" in by_name["import-vllm-5M-hashes"]["stderr"]  # refused for its size
    for name in ("campaign-spec-dev-zero", "continuation-cases-dev-zero",
                 "sim-calibrate-dev-urandom", "plan-config-dev-zero"):
        assert "is not a regular file" in by_name[name]["stderr"], by_name[name]


def test_an_unbounded_read_fails_under_the_same_limit(tmp_path):
    # negative control: with the input reader's cap removed, `campaign /dev/zero` reads until
    # the address-space limit stops it (MemoryError, reported as such), and the check above
    # refuses the outcome
    cases = [{"name": "uncapped-dev-zero", "argv": ["campaign", "/dev/zero", "--out",
                                                    str(tmp_path / "out")], "timeout": 120}]
    result = _run_child(tmp_path, cases, "--uncapped-reads")
    (case,) = result["cases"]
    assert not refused_by_validation(case), case
    assert case["code"] == "timeout" or MEMORY_MESSAGE in case["stderr"], case
