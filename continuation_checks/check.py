"""A whole continuation check: engine, cases, arms, verdicts, outputs (what the CLI runs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuation_checks.cases import Case, check_case, load_cases, make_cases
from continuation_checks.engine import (
    KNOWN_ORGS,
    SERVING_ORGS,
    ContinuationEngine,
    EngineConfig,
    progress,
)
from continuation_checks.report import write_outputs
from continuation_checks.run import FAULTS, run_cases
from continuation_checks.verdict import Verdict
from hybridmem.errors import HybridMemError

ORG_FAULTS = ("stale-checkpoint", "swap-members", "skip-invalidate")  # the organizations' own
DTYPES = ("float32", "bfloat16")
MAX_CASES = 4096
MAX_MODEL_LEN = 1024
TRACE_FILE = "trace.hmt"


@dataclass(frozen=True)
class CheckConfig:
    out: Path
    model: str = "tiny"
    org: str = "vllm"
    dtype: str = "float32"
    cases: int = 64
    seed: int = 0
    fault: str | None = None
    cases_file: Path | None = None
    max_tokens: int = 16
    progress: bool = True

    def check(self) -> None:
        """Raise :class:`HybridMemError` naming the first bad value (before any work)."""
        if self.org not in KNOWN_ORGS:
            raise HybridMemError(f"--org {self.org!r}: not one of {', '.join(KNOWN_ORGS)}")
        if self.org not in SERVING_ORGS:
            raise HybridMemError(f"--org {self.org}: does not serve inside vLLM in this build "
                                 f"(serving: {', '.join(SERVING_ORGS)})")
        if self.dtype not in DTYPES:
            raise HybridMemError(f"--dtype {self.dtype!r}: not one of {', '.join(DTYPES)}")
        if not 1 <= self.cases <= MAX_CASES:
            raise HybridMemError(f"--cases {self.cases}: must lie in [1, {MAX_CASES}]")
        if self.seed < 0:
            raise HybridMemError(f"--seed {self.seed}: must be >= 0")
        if not 1 <= self.max_tokens <= 256:
            raise HybridMemError(f"--max-tokens {self.max_tokens}: must lie in [1, 256]")
        if self.fault is not None:
            if self.fault in ORG_FAULTS:
                raise HybridMemError(f"--fault {self.fault}: an organization's fault; --org "
                                     f"{self.org} has none in this build (available: "
                                     f"{', '.join(FAULTS)})")
            if self.fault not in FAULTS:
                raise HybridMemError(f"--fault {self.fault!r}: not one of "
                                     f"{', '.join(FAULTS + ORG_FAULTS)}")
        if self.out.exists() and not self.out.is_dir():
            raise HybridMemError(f"--out {str(self.out)!r}: exists and is not a directory")
        if self.cases_file is not None and not self.cases_file.is_file():
            raise HybridMemError(f"--cases-file {str(self.cases_file)!r}: no such file")


def exit_code(report: dict[str, Any], fault: str | None) -> int:
    """0 accepted; 1 when the check itself says FAIL.

    Without a fault: any ``state-mismatch`` or ``unexplained`` case fails. With a fault: it fails
    unless some faulted case is ``state-mismatch`` and no unfaulted case is.
    """
    cases = report["cases"]
    bad = (Verdict.STATE_MISMATCH.value, Verdict.UNEXPLAINED.value)
    if fault is None:
        return 1 if any(c["verdict"] in bad for c in cases) else 0
    hit = any(c["faulted"] and c["verdict"] == Verdict.STATE_MISMATCH.value for c in cases)
    false = any(not c["faulted"] and c["verdict"] in bad for c in cases)
    return 0 if hit and not false else 1


def run_check(cfg: CheckConfig) -> dict[str, Any]:
    cfg.check()
    from hybridmem.engines.tiny_model import resolve_model
    from hybridmem.engines.vllm_run import vocab_size

    try:
        model = resolve_model(cfg.model)
    except ValueError as exc:
        raise HybridMemError(str(exc)) from None
    vocab = vocab_size(model)
    file_cases: list[Case] | None = None
    if cfg.cases_file is not None:
        file_cases = load_cases(cfg.cases_file)[: cfg.cases]
    cfg.out.mkdir(parents=True, exist_ok=True)
    trace = cfg.out / TRACE_FILE
    for stale in (trace, trace.with_suffix(".jsonl")):
        stale.unlink(missing_ok=True)
    say = progress if cfg.progress else (lambda _m: None)
    say(f"starting vLLM ({cfg.org}, {cfg.dtype}) on {model}")
    eng = ContinuationEngine(EngineConfig(model, cfg.org, cfg.dtype, cfg.seed,
                                          MAX_MODEL_LEN, trace_path=trace))
    try:
        if file_cases is None:
            cases = make_cases(cfg.cases, cfg.seed, vocab, eng.grid, MAX_MODEL_LEN,
                               max_tokens=cfg.max_tokens)
        else:
            cases = file_cases
        for c in cases:
            check_case(c, eng.grid, vocab, MAX_MODEL_LEN)
        state_dtypes = eng.storage.dtypes()  # the caches are released at shutdown
        say(f"engine ready in {eng.init_s:.1f} s; recurrent grid {eng.grid} tokens; "
            f"{len(cases)} cases")
        results, timing = run_cases(eng, cases, cfg.fault, show_progress=cfg.progress)
    finally:
        t = time.perf_counter()
        eng.shutdown()
        shutdown_s = time.perf_counter() - t
    timing["shutdown_s"] = shutdown_s
    from hybridmem.engines.trace_sink import verify_trace

    written = eng.scheduler._hybridmem_tracer.sink.path if hasattr(
        eng.scheduler, "_hybridmem_tracer") else trace
    meta = {"model": str(model), "org": cfg.org, "dtype": cfg.dtype, "fault": cfg.fault,
            "seed": cfg.seed, "grid_tokens": eng.grid, "max_tokens": cfg.max_tokens,
            "state_dtypes": state_dtypes,
            "cases_file": None if cfg.cases_file is None else str(cfg.cases_file),
            "trace": str(written), "trace_verdict": verify_trace(written)}
    report = write_outputs(cfg.out, results, meta, timing)
    report["exit_code"] = exit_code(report, cfg.fault)
    return report
