"""Tracer exceptions: caller-facing, so the CLI turns them into one line and exit 2."""

from hybridmem.errors import HybridMemError


class TraceError(HybridMemError):
    """A trace that cannot be read at all (wrong magic or version, truncated or damaged header),
    or a writer that cannot be set up (bad options, unwritable path, metadata not JSON)."""
