"""A traced engine core gets time to write its trace's END record when the server stops.

vLLM stops a server (SIGINT or SIGTERM to the API server) by sending SIGTERM to the engine-core
process and, after ``--shutdown-timeout`` seconds, SIGKILL. The default timeout is 0 ("abort"):
in-flight requests are aborted at once, and the process manager kills the engine core right
after the SIGTERM, before the engine core has shut its scheduler down -- so the trace, whose END
record the scheduler's shutdown writes, is left without END and is not accepted.

The kill deadline comes from ``vllm.v1.engine.utils.get_engine_process_shutdown_timeout``, a
function vLLM itself widens on ROCm so that an engine core can release its device before it is
killed. :func:`install` wraps it (in the API-server process, where the plugin also loads): while
``HYBRIDMEM_TRACE`` is set, the engine core gets at least ``HYBRIDMEM_SHUTDOWN_GRACE_S``
seconds (default :data:`DEFAULT_GRACE_S`) between SIGTERM and SIGKILL. Requests are still
aborted (or drained) exactly as ``--shutdown-timeout`` says; only the kill waits, and the
process manager stops waiting as soon as the engine core has exited (about a second on the
tiny model). ``HYBRIDMEM_SHUTDOWN_GRACE_S=0`` restores vLLM's deadline (the negative control:
the trace then ends without END and its verdict says ``END missing``). An engine core that
needs longer than the grace is still killed, and its verdict says so.
"""

from __future__ import annotations

import functools
import os

from hybridmem.names import ENV_TRACE

GRACE_ENV = "HYBRIDMEM_SHUTDOWN_GRACE_S"
DEFAULT_GRACE_S = 30.0
_MARK = "_hybridmem_shutdown_grace"


def grace_s() -> float:
    """The engine core's grace in seconds (0: vLLM's own deadline). ValueError on a bad value."""
    raw = os.environ.get(GRACE_ENV, "")
    if not raw:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 3600:  # also refuses nan and inf
        raise ValueError(f"{GRACE_ENV}={raw[:40]!r}: expected seconds in [0, 3600]")
    return value


def process_timeout(original: float | None, traced: bool, grace: float) -> float | None:
    """The kill deadline the process manager uses: vLLM's ``original`` (None: its 5-s
    default), raised to ``grace`` for a traced engine."""
    if not traced or grace <= 0:
        return original
    return grace if original is None or original < grace else original


def install() -> bool:
    """Wrap vLLM's engine-process shutdown timeout (idempotent). True when wrapped now or
    before; False when this vLLM has no such function (nothing changed)."""
    from vllm.v1.engine import utils

    original = getattr(utils, "get_engine_process_shutdown_timeout", None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def get_engine_process_shutdown_timeout(request_timeout: float | None,
                                            process_timeout_s: float | None) -> float | None:
        base = original(request_timeout, process_timeout_s)
        try:
            grace = grace_s()
        except ValueError:  # never fail a shutdown over it (`hybridmem serve` refuses it early)
            grace = DEFAULT_GRACE_S
        return process_timeout(base, bool(os.environ.get(ENV_TRACE)), grace)

    setattr(get_engine_process_shutdown_timeout, _MARK, True)
    utils.get_engine_process_shutdown_timeout = get_engine_process_shutdown_timeout
    return True


__all__ = ["install", "grace_s", "process_timeout", "GRACE_ENV", "DEFAULT_GRACE_S"]
