"""Errors of the statistics package: caller input that cannot be analysed (CLI exit 2)."""

from hybridmem.errors import HybridMemError


class StatsError(HybridMemError):
    """Unusable statistical input: unpaired seeds, non-positive values, bad levels, ..."""
