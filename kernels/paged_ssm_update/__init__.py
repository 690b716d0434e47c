"""Paged Mamba2 single-token selective state update (state in member pages of a shared pool)."""

from hybridmem.kernels.paged_ssm_update.kernel import paged_selective_state_update
from hybridmem.kernels.paged_ssm_update.reference import (
    SsmParams,
    expand_params,
    paged_selective_state_update_ref,
    selective_state_update_ref,
)

__all__ = [
    "SsmParams",
    "expand_params",
    "paged_selective_state_update",
    "paged_selective_state_update_ref",
    "selective_state_update_ref",
]
