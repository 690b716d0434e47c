"""Readable output: units on figures, which throughput to read, vLLM's log in a file."""

import subprocess
import sys

from hybridmem.cli.summary_text import format_summary, ms, tok_s

SUMMARY = {"organization": "S2", "budget": "b40", "budget_bytes": 3_604_480, "seed": 0,
           "requests": 6, "completed": 6, "throughput_tok_s": 16.00831684925007,
           "throughput_ledger_tok_s": 14.510786062935132, "ttft_p50": 1.212460530163789,
           "ttft_p99": 0.0123456, "e2e_p50": 0.0012345, "e2e_p99": None, "preemptions": 0,
           "prefix_hit_tokens": 1234, "trace_path": "t.hmt", "trace_verdict": {"accepted": True}}


def test_figures_carry_units_and_sensible_digits():
    assert (ms(1.212460530163789), ms(0.0123456), ms(0.0012345), ms(None)) == (
        "1,212 ms", "12.3 ms", "1.23 ms", "-")
    assert tok_s(16.00831684925007) == "16.0 tok/s"
    text = format_summary(SUMMARY)
    assert "16.0 tok/s" in text and "14.5 tok/s" in text and "read this one" in text
    assert "1,212 ms" in text and "12.3 ms" in text and "1,234" in text
    assert "1.212460530163789" not in text  # negative control of the raw float's absence
    assert "16.00831684925007" not in text
    assert "CPU wall-clock" in text
    assert "virtual time" in format_summary({**SUMMARY, "device": "a100-40gb"}, simulated=True)


ROUTE = """
import logging, sys
from pathlib import Path
from hybridmem.cli.engine_log import route_engine_logs
out = Path(sys.argv[1])
path = route_engine_logs(out, sys.argv[2])
print("before", out.exists(), flush=True)
logging.getLogger("vllm.engine").warning("engine says hello")
logging.getLogger("hybridmem.other").warning("not routed")
import warnings; warnings.warn("a FutureWarning", FutureWarning)
print("file", path, flush=True)
"""


def _route(tmp_path, level):
    out = tmp_path / level
    r = subprocess.run([sys.executable, "-c", ROUTE, str(out), level], capture_output=True,
                       text=True, check=True)
    return out, r


def test_engine_log_goes_to_the_file_not_the_terminal(tmp_path):
    out, r = _route(tmp_path, "INFO")
    assert "before False" in r.stdout  # nothing written before the first record
    log = (out / "engine.log").read_text()
    assert "engine says hello" in log and "a FutureWarning" in log
    assert "engine says hello" not in r.stderr + r.stdout
    assert "not routed" in r.stderr  # control: a logger outside the routed set still prints
    off, r = _route(tmp_path, "OFF")
    assert not off.exists() and "engine says hello" not in r.stderr
