"""Supply counts only adoptable boundaries, <= L - 1 for a prompt of L tokens (SPEC §5, §7):
a 1,024-token prompt whose checkpoint at 1,024 is published enters at J = 512, so
adopting 512 is positive-equal, not "shallower" with no loss to blame. SQL and replay alike."""

import pytest

from hybridmem.events import Event, EventKind

from .helpers import Lineage, adopt, pub


def enter_l(rid, step, chain, rchain, prompt_tokens):
    return Event(EventKind.WAITING_ENTRY, step=step, request_id=rid, depth=prompt_tokens,
                 chain=tuple(chain), recurrent_chain=tuple(rchain))


# attention blocks 1, 2 and checkpoints 11 (@512), 12 (@1024) all published before entry
SUPPLY = [pub(1, 1), pub(2, 1), pub(11, 1, rec=True), pub(12, 1, rec=True)]


@pytest.mark.parametrize("prompt,j_enter,klass", [
    (1024, 512, "positive-equal"),   # the checkpoint at 1,024 = L is not adoptable
    (1025, 1024, "shallower"),       # negative control: at L - 1 = 1,024 it is
    (0, 1024, "shallower"),          # prompt length not recorded: no cap
])
def test_entry_depth_capped_at_prompt_minus_one(prompt, j_enter, klass):
    lin = Lineage(SUPPLY + [enter_l("a", 2, [1, 2], [11, 12], prompt), adopt("a", 3, 512)])
    lin.assert_agree()
    row = lin["a"]
    assert row["j_enter"] == j_enter and row["j_adopt"] == 512 and row["class"] == klass
    ep = lin.replay.episodes[("a", 0)]
    assert ep.j_enter == j_enter


def test_lookup_supply_capped_too():
    """Adopted (lookup-time) supply: R_max at the adoption cut is capped the same way."""
    lin = Lineage([enter_l("a", 2, [1, 2], [11, 12], 1024)] + SUPPLY[:] +
                  [adopt("a", 3, 512)])
    lin.assert_agree()
    row = lin["a"]
    assert row["r_max_exact"] == 512 and row["j_lookup_exact"] == 512
