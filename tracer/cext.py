"""Loads the optional compiled extension ``tracer._ctrace`` (``tracer/_ctrace.c``), or says why
not. ``pip install -e .`` builds it (``pyproject.toml``: optional, so a failed compile leaves the
pure-Python writer). A build older than the Python side (another ``API_VERSION``) is not used:
rebuild with ``pip install -e .`` (``make`` does when ``tracer/_ctrace.c`` changed)."""

from __future__ import annotations

import functools
import os
from typing import Any

from hybridmem.extensions import load_extension

API_VERSION = 3  # tracer/_ctrace.c CTRACE_API_VERSION: bump both on any interface change
PURE_ENV = "HYBRIDMEM_TRACER_PURE"  # any value but "" and "0": no compiled code


def pure_forced() -> bool:
    """``HYBRIDMEM_TRACER_PURE`` asks for the pure-Python writer (any value but "" and "0")."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


@functools.cache
def load() -> tuple[Any, str | None]:
    """(the module, None), or (None, why it cannot be used)."""
    return load_extension("tracer._ctrace", API_VERSION)
