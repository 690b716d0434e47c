"""Single-token causal conv1d update with conv state addressed by slot line ids (S2)."""

from hybridmem.kernels.conv_slot_update.kernel import conv_slot_update
from hybridmem.kernels.conv_slot_update.reference import conv_slot_update_ref, conv_update_ref

__all__ = ["conv_slot_update", "conv_slot_update_ref", "conv_update_ref"]
