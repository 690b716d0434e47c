"""Project exceptions. Caller and capacity errors carry the offending numbers in their message."""


class HybridMemError(ValueError):
    """Base class for errors caused by the caller's input; the CLI turns them into exit 2."""


class ConfigError(HybridMemError):
    """A model config or preset that cannot give a hybrid geometry."""


class GeometryError(HybridMemError):
    """A geometry that an organization cannot lay out (e.g. conv slot does not divide the page)."""


class BudgetError(HybridMemError):
    """A budget label, byte count or attention fraction that is not usable."""
