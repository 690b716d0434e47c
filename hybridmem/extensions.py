"""Loading an optional compiled extension (the trace writer's ``tracer._ctrace``).

Each is built by ``pip install -e .`` when a C compiler is there (``pyproject.toml``
ext-modules, ``optional = true``) and carries an ``API_VERSION`` its Python side checks, so a
stale build left in the tree after an interface change is never called.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_extension(name: str, api_version: int) -> tuple[Any, str | None]:
    """``(module, None)``, or ``(None, why it cannot be used)``: not built (no compiler at
    install time, or another ABI), or a stale build of another API version."""
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        return None, f"{name} not importable ({exc})"
    found = getattr(mod, "API_VERSION", None)
    if found != api_version:
        return None, (f"{name} is a stale build (API {found}, expected {api_version}): rebuild "
                      "it with pip install -e .")
    return mod, None
