"""hybridmem: memory organization for hybrid attention-SSM LLM serving (arXiv 2610.15755).

``import hybridmem`` imports nothing else (the tracer imports ``hybridmem.events`` without
pulling in the organizations); the notebook entry points of :mod:`hybridmem.api` load on first
use: ``hybridmem.plan``, ``hybridmem.organization``, ``hybridmem.model_units``,
``hybridmem.open_lineage``, ``hybridmem.trace_events``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = ("plan", "organization", "model_units", "open_lineage", "trace_events")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from hybridmem import api

        return getattr(api, name)
    raise AttributeError(f"module 'hybridmem' has no attribute {name!r}")
