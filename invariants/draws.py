"""Integer strategies whose draws do not depend on which modules the process has loaded.

Hypothesis (6.x) draws an integer, with probability 0.05, from the integer literals of every
local module loaded so far (its "local constants"; literals with ``|v| < 100`` are left out,
small integers being weighted up anyway). A derandomized program therefore changed with the
modules earlier tests happened to import: ``test_state_machine[D0]`` reached a situation alone
but not after ``tests/hybridmem``. :func:`integers` draws a value in ``[lo, hi]`` as hundreds
and units, two draws whose ranges (at most ``[0, 99]``) hold no local constant, so the pool is
never consulted -- and, instead of the pool, one of :data:`NUMBERS` (the organizations' own
grid sizes and limits, good draws for a memory organization) about as often as Hypothesis drew
constants. Ranges within ``(-100, 100)`` are plain ``st.integers``: no local constant lies in
them. No Hypothesis internal is read or patched.

The split and the selector value shape the derandomized programs (another choice gives other
programs); these reach every situation ``tests/invariants/test_stateful.py`` asks for and kill
the whole mutant set. ``tests/invariants/test_constants.py`` proves the independence: a module
with new literals in every range, loaded mid-run, changes plain ``st.integers`` draws (the
control) and none of these, and leaves the state machines' programs unchanged.
"""

from __future__ import annotations

from hypothesis import strategies as st

# grid sizes, slab and pool limits of the organizations (what their literals contributed to
# Hypothesis's pool when the machines' programs were tuned)
NUMBERS = (120, 128, 150, 255, 256, 300, 512, 600, 1000, 1024, 1200)
ONE_IN = 20  # a listed number about one draw in 20 (Hypothesis drew constants at 0.05)
_LISTED = 7  # the selector value that picks one (not 0 or 19: Hypothesis favours the ends)


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """``st.integers(lo, hi)`` without Hypothesis's module-constant draws (see the module doc)."""
    if lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]")
    if -100 < lo and hi < 100:
        return st.integers(lo, hi)
    span = hi - lo + 1
    listed = tuple(v for v in NUMBERS if lo <= v <= hi)

    def value(parts: tuple[int, int, int, int]) -> int:
        pick, which, high, low = parts
        if listed and pick == _LISTED:
            return listed[which % len(listed)]
        return min(hi, lo + 100 * high + low)

    # hundreds and units as two small draws (a range of up to 10,000 values)
    if span > 100 * 100:
        raise ValueError(f"[{lo}, {hi}]: more than 10,000 values")
    return st.tuples(st.integers(0, ONE_IN - 1), st.integers(0, 99),
                     st.integers(0, (span - 1) // 100), st.integers(0, 99)).map(value)
