"""Kernel-level continuation (App. D.5 scope): restart a recurrence from a
checkpoint kept in S1 member pages / S2 slot lines and continue it, against the uninterrupted
contiguous run.

One decode step of a minimal Mamba2 block (conv feeds the SSM, as in ``MambaMixer2``)::

    u_t --conv (state [conv_dim, K-1])--> xBC_t = [x | B | C] --SSM (state [H, P, N])--> y_t

Two runs of T = T0 + T1 steps on the same inputs, fp32 state, bf16 activations and outputs:

    contiguous  state in identity-addressed rows, T steps, never moved
    restarted   state scattered into random member pages (SSM) and slot lines (conv), T0 steps,
                gathered into an arena (the checkpoint at b = T0), scattered to *other* random
                pages / lines (the adopting request's storage), T1 more steps

Every output y_t and the final states must be bit-identical (``torch.equal``) at batch 8, 32, 53,
for the Triton kernels (interpreter on CPU) and for the torch references. The negative controls
restore the checkpoint with two member pages swapped, or read the conv state from a wrong line id:
the continued outputs must then differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from hybridmem.kernels.checkpoint_copy import (
    gather_checkpoint,
    gather_checkpoint_ref,
    scatter_checkpoint,
    scatter_checkpoint_ref,
)
from hybridmem.kernels.conv_slot_update import conv_slot_update, conv_slot_update_ref
from hybridmem.kernels.paged_ssm_update import (
    paged_selective_state_update,
    paged_selective_state_update_ref,
)
from hybridmem.kernels.paged_ssm_update.reference import expand_params
from hybridmem.kernels.paging import num_members, slab_lines
from tests.kernels.helpers import DEVICE, assert_equal, random_page_ids

HEADS, HEAD_DIM, D_STATE, GROUPS, D_CONV = 4, 8, 16, 2, 4
SSM_ELEMS = HEADS * HEAD_DIM * D_STATE                  # 512
CONV_DIM = HEADS * HEAD_DIM + 2 * GROUPS * D_STATE       # 96: x | B | C
CONV_ELEMS = CONV_DIM * (D_CONV - 1)                     # 288 of a 512-element slot
EPP = 128                                                # SSM elements per page: 4 members
SLOTS, SLOT_ELEMS = 4, 512                               # conv slab: 4 slots per 2,048-elem page
T0, T1 = 2, 2                                            # steps before / after the restart
STATE, ACT = torch.float32, torch.bfloat16


@dataclass
class Weights:
    conv_w: torch.Tensor
    conv_b: torch.Tensor
    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor


@dataclass
class Inputs:
    u: torch.Tensor    # [T, batch, CONV_DIM] conv inputs
    dt: torch.Tensor   # [T, batch, HEADS]
    z: torch.Tensor    # [T, batch, HEADS, HEAD_DIM]


def make_world(batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    w = Weights(
        conv_w=(r(CONV_DIM, D_CONV) * 0.5).to(ACT).to(DEVICE),
        conv_b=(r(CONV_DIM) * 0.1).to(ACT).to(DEVICE),
        A=(-torch.exp(r(HEADS) * 0.5)).to(DEVICE),
        D=r(HEADS).to(DEVICE),
        dt_bias=(r(HEADS) * 0.1).to(DEVICE),
    )
    steps = T0 + T1
    inp = Inputs(u=r(steps, batch, CONV_DIM).to(ACT).to(DEVICE),
                 dt=(r(steps, batch, HEADS) * 0.5).to(ACT).to(DEVICE),
                 z=r(steps, batch, HEADS, HEAD_DIM).to(ACT).to(DEVICE))
    ssm0 = r(batch, SSM_ELEMS).to(STATE).to(DEVICE)
    conv0 = r(batch, CONV_ELEMS).to(STATE).to(DEVICE)
    return gen, w, inp, ssm0, conv0


class Impl:
    """The kernels (``tri``) or the torch references (``ref``) behind one interface."""

    def __init__(self, name: str) -> None:
        self.name = name

    def step(self, ssm_pool, pages, lines_pool, lines, w: Weights, inp: Inputs, t: int):
        u = inp.u[t]
        if self.name == "tri":
            xbc = conv_slot_update(lines_pool, lines, None, u, w.conv_w, w.conv_b, silu=True)
        else:
            xbc = conv_slot_update_ref(lines_pool, lines, None, u, w.conv_w, w.conv_b, silu=True)
        batch = u.shape[0]
        x = xbc[:, : HEADS * HEAD_DIM].reshape(batch, HEADS, HEAD_DIM)
        B = xbc[:, HEADS * HEAD_DIM: HEADS * HEAD_DIM + GROUPS * D_STATE].reshape(
            batch, GROUPS, D_STATE)
        C = xbc[:, HEADS * HEAD_DIM + GROUPS * D_STATE:].reshape(batch, GROUPS, D_STATE)
        if self.name == "tri":
            return paged_selective_state_update(
                ssm_pool, pages, None, x, inp.dt[t], w.A, B, C, w.D, inp.z[t], w.dt_bias,
                dt_softplus=True, d_state=D_STATE)
        p = expand_params(x, inp.dt[t], w.A, B, C, w.D, inp.z[t], w.dt_bias, D_STATE)
        return paged_selective_state_update_ref(ssm_pool, pages, None, p, dt_softplus=True)

    def scatter(self, *args):
        (scatter_checkpoint if self.name == "tri" else scatter_checkpoint_ref)(*args)

    def gather(self, *args):
        (gather_checkpoint if self.name == "tri" else gather_checkpoint_ref)(*args)


def contiguous_run(impl: Impl, w, inp, ssm0, conv0):
    """T steps on identity-addressed state; returns (outputs [T, ...], final ssm, final conv)."""
    batch = ssm0.shape[0]
    members = num_members(SSM_ELEMS, EPP)
    ssm_pool = ssm0.clone().view(batch * members, EPP)
    ident = torch.arange(batch * members, dtype=torch.int32, device=DEVICE).view(batch, members)
    line_pool = torch.zeros(batch, SLOT_ELEMS, dtype=STATE, device=DEVICE)
    line_pool[:, :CONV_ELEMS] = conv0
    lines = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    outs = [impl.step(ssm_pool, ident, line_pool, lines, w, inp, t) for t in range(T0 + T1)]
    return torch.stack(outs), ssm_pool.view(batch, -1).clone(), line_pool[:, :CONV_ELEMS].clone()


class Storage:
    """A shared page pool (random live data everywhere) holding the SSM members and conv slabs."""

    def __init__(self, batch: int, gen: torch.Generator) -> None:
        members = num_members(SSM_ELEMS, EPP)
        self.ssm_pool = torch.randn(4 * batch * members + 3, EPP, generator=gen).to(STATE)
        self.ssm_pool = self.ssm_pool.to(DEVICE)
        slabs = -(-4 * batch // SLOTS) + 2
        self.slab_pool = torch.randn(slabs, SLOTS * SLOT_ELEMS, generator=gen).to(STATE).to(DEVICE)
        self.lines_pool = slab_lines(self.slab_pool, SLOTS)
        page_ids = random_page_ids(self.ssm_pool.shape[0], 2 * batch * members, gen, exclude=(0,))
        line_ids = random_page_ids(self.lines_pool.shape[0], 2 * batch, gen, exclude=(0,))
        page_ids = page_ids.to(torch.int32).to(DEVICE)
        line_ids = line_ids.to(torch.int32).to(DEVICE)
        # producer's storage and the adopter's storage: disjoint, neither uses page/line 0
        self.pages = [page_ids[: batch * members].view(batch, members),
                      page_ids[batch * members:].view(batch, members)]
        self.lines = [line_ids[:batch], line_ids[batch:]]


def restarted_run(impl: Impl, w, inp, ssm0, conv0, gen, fault: str | None = None):
    """T0 steps in the producer's storage, checkpoint, restore into the adopter's, T1 steps.

    ``fault``: ``"swap-members"`` restores with member pages 0 and 1 of row 0 swapped;
    ``"wrong-line"`` continues row 0 from another sequence's conv line.
    """
    batch = ssm0.shape[0]
    st = Storage(batch, gen)
    impl.scatter(st.ssm_pool, st.pages[0], st.lines_pool, st.lines[0], ssm0, conv0)
    outs = [impl.step(st.ssm_pool, st.pages[0], st.lines_pool, st.lines[0], w, inp, t)
            for t in range(T0)]
    ck_ssm = torch.empty(batch, SSM_ELEMS, dtype=STATE, device=DEVICE)
    ck_conv = torch.empty(batch, CONV_ELEMS, dtype=STATE, device=DEVICE)
    impl.gather(st.ssm_pool, st.pages[0], st.lines_pool, st.lines[0], ck_ssm, ck_conv)
    pages, lines = st.pages[1].clone(), st.lines[1].clone()
    impl.scatter(st.ssm_pool, pages, st.lines_pool, lines, ck_ssm, ck_conv)
    if fault == "swap-members":
        pages[0, [0, 1]] = pages[0, [1, 0]]
    elif fault == "wrong-line":
        lines[0] = st.lines[0][1]  # another sequence's (row 1's) conv line in the producer's slab
    elif fault is not None:
        raise ValueError(f"unknown fault {fault!r}")
    outs += [impl.step(st.ssm_pool, pages, st.lines_pool, lines, w, inp, t)
             for t in range(T0, T0 + T1)]
    final_ssm = torch.empty_like(ck_ssm)
    final_conv = torch.empty_like(ck_conv)
    impl.gather(st.ssm_pool, pages, st.lines_pool, lines, final_ssm, final_conv)
    return torch.stack(outs), final_ssm, final_conv


# The Triton interpreter costs ~1 s per kernel launch per 8 sequences: batches 32 and 53 of the
# kernels are slow on CPU (HYBRIDMEM_SLOW=1), fast on a GPU; the references run every batch.
_INTERPRETED = not torch.cuda.is_available()
CASES = [
    pytest.param(b, impl, id=f"batch{b}-{impl}",
                 marks=[pytest.mark.slow] if impl == "tri" and b > 8 and _INTERPRETED else [])
    for b in (8, 32, 53) for impl in ("tri", "ref")
]


@pytest.mark.parametrize(("batch", "impl"), CASES)
def test_restart_from_paged_checkpoint_equals_contiguous(batch: int, impl: str):
    gen, w, inp, ssm0, conv0 = make_world(batch, 500 + batch)
    k = Impl(impl)
    out_c, ssm_c, conv_c = contiguous_run(k, w, inp, ssm0, conv0)
    out_r, ssm_r, conv_r = restarted_run(k, w, inp, ssm0, conv0, gen)
    assert out_c.dtype == ACT and ssm_c.dtype == STATE
    assert_equal(f"{impl} outputs, restarted vs contiguous", out_r, out_c)
    assert_equal(f"{impl} final SSM state, restarted vs contiguous", ssm_r, ssm_c)
    assert_equal(f"{impl} final conv state, restarted vs contiguous", conv_r, conv_c)
    # the recurrence is live: the state moved and the outputs after the restart depend on it
    assert not torch.equal(ssm_c, ssm0) and not torch.equal(conv_c, conv0)


@pytest.mark.parametrize("fault", ["swap-members", "wrong-line"])
@pytest.mark.parametrize("impl", ["tri", "ref"])
def test_negative_control_breaks_equality(impl: str, fault: str):
    batch = 4  # small: the Triton interpreter's cost grows with the batch
    gen, w, inp, ssm0, conv0 = make_world(batch, 900)
    k = Impl(impl)
    out_c, _, _ = contiguous_run(k, w, inp, ssm0, conv0)
    out_r, _, _ = restarted_run(k, w, inp, ssm0, conv0, gen, fault=fault)
    # before the restart: identical; after: row 0 (the faulty one) differs, the others do not
    assert_equal("outputs before the restart", out_r[:T0], out_c[:T0])
    assert not torch.equal(out_r[T0:, 0], out_c[T0:, 0]), f"{fault}: row 0 still equal"
    assert_equal("outputs of untouched rows after the restart", out_r[T0:, 1:], out_c[T0:, 1:])


def test_kernels_match_references_on_the_restarted_run():
    """The Triton path and the torch path agree to bf16 rounding (they are different code)."""
    batch = 4
    _, w, inp, ssm0, conv0 = make_world(batch, 77)
    out_t, ssm_t, _ = contiguous_run(Impl("tri"), w, inp, ssm0, conv0)
    out_r, ssm_r, _ = contiguous_run(Impl("ref"), w, inp, ssm0, conv0)
    assert torch.allclose(out_t.float(), out_r.float(), atol=3e-2, rtol=3e-2)
    assert torch.allclose(ssm_t, ssm_r, atol=1e-3, rtol=1e-3)
