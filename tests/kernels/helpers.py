"""Labelled asserts and pool builders shared by the kernel tests."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_equal(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-exact equality (torch.equal), with the first differing position in the message."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if not torch.equal(got, want):
        diff = (got != want) & ~(got.isnan() & want.isnan()) if got.is_floating_point() else (
            got != want)
        idx = tuple(int(i) for i in diff.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {got.numel()} elements differ; first at {idx}: "
            f"{got[idx].item()!r} != {want[idx].item()!r}"
        )


def assert_close(what: str, got: torch.Tensor, want: torch.Tensor, atol: float,
                 rtol: float) -> None:
    """|got - want| <= atol + rtol |want| elementwise (in fp32)."""
    g, w = got.float(), want.float()
    bound = atol + rtol * w.abs()
    err = (g - w).abs()
    bad = err > bound
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.numel()} elements outside atol={atol} "
            f"rtol={rtol}; max err {err.max().item():.3g}; first at {idx}: "
            f"{g[idx].item()!r} vs {w[idx].item()!r}"
        )


def random_page_ids(num_pages: int, count: int, gen: torch.Generator,
                    exclude: tuple[int, ...] = ()) -> torch.Tensor:
    """``count`` distinct ids drawn from ``[0, num_pages)`` minus ``exclude``, random order."""
    allowed = torch.tensor([p for p in range(num_pages) if p not in exclude])
    assert allowed.numel() >= count, "test pool too small: this indicates a bad test setup"
    return allowed[torch.randperm(allowed.numel(), generator=gen)[:count]]
