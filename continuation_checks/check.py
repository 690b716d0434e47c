"""A whole continuation check: engine, cases, arms, verdicts, outputs (what the CLI runs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuation_checks.cases import (
    Case,
    check_case,
    load_cases,
    make_cases,
    make_edge_cases,
)
from continuation_checks.engine import (
    DEFAULT_BUDGET,
    KNOWN_ORGS,
    ContinuationEngine,
    EngineConfig,
    progress,
)
from continuation_checks.report import write_outputs, write_stopped
from continuation_checks.run import FAULTS, ORG_FAULTS, VLLM_FAULTS, run_cases
from continuation_checks.verdict import Verdict
from hybridmem.errors import HybridMemError
from hybridmem.inputs import check_regular

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
    budget: str | None = None  # organization mode (default DEFAULT_BUDGET)
    attention_fraction: float | None = None  # D0 on a model without a preset
    edges: bool = False  # seeded cases at exact block boundaries (cases.make_edge_cases)

    def engine_fault(self) -> str | None:
        """The fault the engine itself injects (an organization's), else None."""
        return self.fault if self.fault in ORG_FAULTS else None

    def engine_config(self, model: Path, trace: Path | None = None) -> EngineConfig:
        return EngineConfig(model, self.org, self.dtype, self.seed, MAX_MODEL_LEN,
                            trace_path=trace, budget=self.budget or DEFAULT_BUDGET,
                            fault=self.engine_fault(),
                            attention_fraction=self.attention_fraction)

    def check(self) -> None:
        """Raise :class:`HybridMemError` naming the first bad value (before any work)."""
        if self.org not in KNOWN_ORGS:
            raise HybridMemError(f"--org {self.org!r}: not one of {', '.join(KNOWN_ORGS)}")
        if self.org == "vllm":
            for flag, given in (("budget", self.budget is not None),
                                ("attention-fraction", self.attention_fraction is not None)):
                if given:
                    raise HybridMemError(f"--{flag} needs an organization (--org S0|S1|S2|D0), "
                                         "not --org vllm")
        if self.dtype not in DTYPES:
            raise HybridMemError(f"--dtype {self.dtype!r}: not one of {', '.join(DTYPES)}")
        if not 1 <= self.cases <= MAX_CASES:
            raise HybridMemError(f"--cases {self.cases}: must lie in [1, {MAX_CASES}]")
        if self.seed < 0:
            raise HybridMemError(f"--seed {self.seed}: must be >= 0")
        if not 1 <= self.max_tokens <= 256:
            raise HybridMemError(f"--max-tokens {self.max_tokens}: must lie in [1, 256]")
        if self.fault is not None:
            if self.fault in ORG_FAULTS and self.org == "vllm":
                raise HybridMemError(f"--fault {self.fault}: an organization's fault; --org "
                                     f"vllm has none (available: {', '.join(FAULTS)})")
            if self.fault in VLLM_FAULTS and self.org != "vllm":
                raise HybridMemError(f"--fault {self.fault}: a fault of the stock path; it "
                                     "needs --org vllm")
            if self.fault not in FAULTS + ORG_FAULTS:
                raise HybridMemError(f"--fault {self.fault!r}: not one of "
                                     f"{', '.join(FAULTS + ORG_FAULTS)}")
        if self.org != "vllm":
            try:  # budget text, fault, attention fraction: hybridmem run's own validation
                EngineConfig(Path(self.model), self.org, self.dtype, self.seed, MAX_MODEL_LEN,
                             budget=self.budget or DEFAULT_BUDGET, fault=self.engine_fault(),
                             attention_fraction=self.attention_fraction).run_config().check()
            except ValueError as exc:
                raise HybridMemError(str(exc)) from None
        if self.out.exists() and not self.out.is_dir():
            raise HybridMemError(f"--out {str(self.out)!r}: exists and is not a directory")
        if self.cases_file is not None:
            if self.edges:
                raise HybridMemError("--edges makes the seeded cases; a --cases-file brings "
                                     "its own: give one")
            check_regular(self.cases_file, "--cases-file")  # missing, or a device or pipe
            load_cases(self.cases_file)  # types and ranges, before any engine starts


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
    from hybridmem.engines.vllm_run import check_org_model

    engine_cfg = cfg.engine_config(model)
    check_org_model(engine_cfg.run_config(), model)  # D0 without an attention fraction
    file_cases: list[Case] | None = None
    if cfg.cases_file is not None:
        file_cases = load_cases(cfg.cases_file)[: cfg.cases]
    cfg.out.mkdir(parents=True, exist_ok=True)
    trace = cfg.out / TRACE_FILE
    for stale in (trace, trace.with_suffix(".jsonl")):
        stale.unlink(missing_ok=True)
    say = progress if cfg.progress else (lambda _m: None)
    say(f"starting vLLM ({cfg.org}, {cfg.dtype}) on {model}")
    eng = ContinuationEngine(cfg.engine_config(model, trace))
    org_meta: dict[str, Any] = {}
    stopped: str | None = None
    timing: dict[str, Any] = {"engine_init_s": eng.init_s}
    try:
        if eng.plan is not None:
            from hybridmem.vllm_plugin.org_settings import fits_one_request

            why = fits_one_request(eng.plan, MAX_MODEL_LEN)
            if why is not None:
                raise HybridMemError(f"--budget: {why}")
        if file_cases is None:
            make = make_edge_cases if cfg.edges else make_cases
            cases = make(cfg.cases, cfg.seed, vocab, eng.interval, MAX_MODEL_LEN,
                         max_tokens=cfg.max_tokens)
        else:
            cases = file_cases
        for c in cases:
            check_case(c, eng.interval, vocab, MAX_MODEL_LEN)
        state_dtypes = eng.storage.dtypes()  # the caches are released at shutdown
        say(f"engine ready in {eng.init_s:.1f} s; block {eng.grid} tokens, recurrent grid "
            f"{eng.interval} tokens; {len(cases)} cases")
        try:
            results, timing = run_cases(eng, cases, cfg.fault, show_progress=cfg.progress)
        except Exception as exc:  # noqa: BLE001 (only the organization's invariant stop)
            if type(exc).__name__ != "InvariantStop":
                raise
            stopped, results = str(exc), []
            say(f"the engine stopped: {stopped}")
        if eng.plan is not None:
            kvm = eng.scheduler.kv_cache_manager
            org_meta = {"org_plan": eng.plan.as_dict(), "org_counters": dict(kvm.counters),
                        "fault_count": kvm.fault_count,
                        "state_storage": getattr(eng.scheduler, "state_storage", None)}
    finally:
        t = time.perf_counter()
        eng.shutdown()
        shutdown_s = time.perf_counter() - t
    timing["shutdown_s"] = shutdown_s
    from hybridmem.engines.trace_sink import verify_trace

    written = eng.scheduler._hybridmem_tracer.sink.path if hasattr(
        eng.scheduler, "_hybridmem_tracer") else trace
    meta = {"model": str(model), "org": cfg.org, "dtype": cfg.dtype, "fault": cfg.fault,
            "seed": cfg.seed, "grid_tokens": eng.interval, "block_tokens": eng.grid,
            "max_tokens": cfg.max_tokens, "state_dtypes": state_dtypes,
            "budget": None if cfg.org == "vllm" else cfg.budget or DEFAULT_BUDGET, **org_meta,
            "cases_file": None if cfg.cases_file is None else str(cfg.cases_file),
            "case_set": "file" if cfg.cases_file is not None else (
                "edges" if cfg.edges else "seeded"),
            "trace": str(written), "trace_verdict": verify_trace(written)}
    if stopped is not None:
        report = write_stopped(cfg.out, meta, timing, stopped)
        report["exit_code"] = 1  # no case classified: not accepted, fault or not
        return report
    report = write_outputs(cfg.out, results, meta, timing)
    report["exit_code"] = exit_code(report, cfg.fault)
    return report
