"""Gather/scatter of whole checkpoints (SSM member pages + conv line) to/from an arena."""

from hybridmem.kernels.checkpoint_copy.kernel import (
    gather_checkpoint,
    gather_pages,
    scatter_checkpoint,
    scatter_pages,
)
from hybridmem.kernels.checkpoint_copy.reference import (
    gather_checkpoint_ref,
    gather_pages_ref,
    scatter_checkpoint_ref,
    scatter_pages_ref,
)

__all__ = [
    "gather_checkpoint",
    "gather_checkpoint_ref",
    "gather_pages",
    "gather_pages_ref",
    "scatter_checkpoint",
    "scatter_checkpoint_ref",
    "scatter_pages",
    "scatter_pages_ref",
]
