"""Every depth class, a slab reclaim, the same-step M0/M1 bracket, preemption/resume, D0's grid,
and a salted request, each on a table small enough to work out by hand."""

from hybridmem.events import Cause, Event, EventKind

from .helpers import D0, Lineage, adopt, enter, loss, pub

# S2 grid, 512 tokens. Shared context: blocks A0..A2, checkpoints R0 (512), R1 (1024), R2 (1536).
A0, A1, A2 = 0xA0, 0xA1, 0xA2
R0, R1, R2 = 0xB0, 0xB1, 0xB2


def test_every_class_with_worked_answers():
    ev = [
        pub(A0, 1), pub(A1, 1), pub(A2, 1), pub(R0, 1, rec=True), pub(R1, 1, rec=True),  # 0-4
        enter("zz", 2, [0x10, 0x11], [0x20, 0x21]),  # 5: nothing of its own valid
        enter("eq", 2, [A0, A1], [R0, R1]),          # 6: J_enter 1024
        enter("new", 2, [0x30, 0x31], [0x40, 0x41]),  # 7: J_enter 0
        enter("deep", 2, [A0, A1, A2], [R0, R1, R2]),  # 8: R2 missing -> J_enter 1024
        enter("shal", 2, [A0, A1], [R0, R1]),        # 9: J_enter 1024
        adopt("zz", 3, 0),                           # 10
        adopt("eq", 3, 1024),                        # 11
        pub(0x30, 3, rid="q"),                       # 12: n=1 but no checkpoint: J stays 0
        pub(0x40, 3, rec=True, rid="q"),             # 13: J 0 -> 512 for "new"
        pub(R2, 3, rec=True, rid="q"),               # 14: J 1024 -> 1536 for "deep"
        adopt("new", 4, 512),                        # 15
        adopt("deep", 4, 1536),                      # 16
        loss(A1, 5, requester="other"),              # 17: "shal" J 1024 -> 512
        adopt("shal", 6, 512),                       # 18
    ]
    lin = Lineage(ev)
    expect = {  # request: (J_enter, J_adopt, class, inc pubs, dec losses, other-request losses)
        "zz": (0, 0, "zero->zero", 0, 0, 0),
        "eq": (1024, 1024, "positive-equal", 0, 0, 0),
        "new": (0, 512, "zero->positive", 1, 0, 0),
        "deep": (1024, 1536, "deeper", 1, 0, 0),
        "shal": (1024, 512, "shallower", 0, 1, 1),
    }
    for rid, (je, ja, cls, inc, dec, other) in expect.items():
        r = lin[rid]
        got = (r["j_enter"], r["j_adopt"], r["class"], r["depth_increasing_publications"],
               r["depth_decreasing_losses"], r["other_request_allocation_losses"])
        assert got == (je, ja, cls, inc, dec, other), f"{rid}: {got}"
    # "shal" at its lookup (step 6): A1 lost -> attention prefix 512 -> A_max 512, R_max 1024
    assert (lin["shal"]["a_max_m0"], lin["shal"]["r_max_m0"], lin["shal"]["gap_r_m0"]) == \
        (512, 1024, 512)
    summary = lin.query("SELECT * FROM run_summary")[0]
    assert (summary["shallower_episodes"], summary["shallower_with_other_request_loss"]) == (1, 1)
    assert (summary["publications"], summary["losses"]) == (8, 1)
    assert (summary["depth_increasing_publications"], summary["depth_decreasing_losses"]) == (2, 1)
    counts = {r["class"]: r["episodes"] for r in
              lin.query("SELECT * FROM class_counts WHERE scope = 'INITIAL'")}
    assert counts == {"zero->zero": 1, "positive-equal": 1, "zero->positive": 1, "deeper": 1,
                      "shallower": 1}
    lin.assert_agree()


def test_slab_reclaim_takes_several_checkpoints_but_one_loss_moves_J():
    # chain fully valid: J_enter 1536. The slab reclaim drops R1 then R2 (same step, for "b"):
    #   loss R1: J stays 1536 (R2 still there)       -> not depth-decreasing
    #   loss R2: deepest valid checkpoint now 512    -> depth-decreasing, 1536 -> 512
    ev = [
        pub(A0, 1), pub(A1, 1), pub(A2, 1),
        pub(R0, 1, rec=True), pub(R1, 1, rec=True), pub(R2, 1, rec=True),
        enter("w", 2, [A0, A1, A2], [R0, R1, R2]),
        loss(R1, 3, rec=True, cause=Cause.SLAB_RECLAIM, requester="b"),
        loss(R2, 3, rec=True, cause=Cause.SLAB_RECLAIM, requester="b"),
        adopt("w", 4, 512),
    ]
    lin = Lineage(ev)
    r = lin["w"]
    assert (r["j_enter"], r["j_adopt"], r["class"]) == (1536, 512, "shallower")
    assert (r["depth_decreasing_losses"], r["other_request_allocation_losses"]) == (1, 1)
    (chg,) = lin.query("SELECT * FROM depth_changes")
    assert (chg["seq"], chg["cause"], chg["j_before"], chg["j_after"]) == (8, "slab_reclaim",
                                                                         1536, 512)
    causes = lin.query("SELECT * FROM loss_causes")
    assert causes == [{"cause": "slab_reclaim", "state_kind": "recurrent", "losses": 2,
                       "effective_losses": 2, "depth_decreasing_losses": 1}]
    lin.assert_agree()


def test_same_step_publication_separates_m0_and_m1():
    # Both wait with A0, A1, R0 valid and R1 missing. In step 7, "q" publishes R1:
    #   "late" looks up before that publication (seq order): exact R_max 512 = M0 < M1 1024
    #   "early" looks up after it:                            exact R_max 1024 = M1
    # "late" also publishes its own key in step 7: M1 must not count it.
    own = 0xC1
    ev = [
        pub(A0, 1), pub(A1, 1), pub(R0, 1, rec=True),
        enter("late", 5, [A0, A1, own], [R0, R1]),
        enter("early", 5, [A0, A1], [R0, R1]),
        adopt("late", 7, 512),
        pub(R1, 7, rec=True, rid="q"),
        pub(own, 7, rid="late"),
        adopt("early", 7, 1024),
    ]
    lin = Lineage(ev)
    late, early = lin["late"], lin["early"]
    assert (late["r_max_m0"], late["r_max_m1"], late["r_max_exact"]) == (512, 1024, 512)
    assert (late["gap_r_m0"], late["gap_r_m1"]) == (0, 512)
    # attention: A0, A1 valid, own block not (M1 ignores the request's own publication)
    assert (late["a_max_m0"], late["a_max_m1"], late["a_max_exact"]) == (1024, 1024, 1024)
    assert (early["r_max_m0"], early["r_max_m1"], early["r_max_exact"]) == (512, 1024, 1024)
    assert (early["j_enter"], early["class"], early["depth_increasing_publications"]) == \
        (512, "deeper", 1)
    lin.assert_agree()


def test_preemption_and_resume_are_separate_episodes():
    # r waits with nothing cached (INITIAL: 0 -> 0), computes and publishes its prefix, is
    # preempted, and re-enters (RESUME count 1) with J_enter 1024. While it waits, another
    # request's allocation takes R1: RESUME adopts 512 -> shallower, attributed.
    ev = [
        enter("r", 1, [A0, A1], [R0, R1]),
        adopt("r", 1, 0),
        pub(A0, 2, rid="r"), pub(A1, 2, rid="r"), pub(R0, 2, rec=True, rid="r"),
        pub(R1, 2, rec=True, rid="r"),
        Event(EventKind.PREEMPTION, step=3, request_id="r"),
        enter("r", 3, [A0, A1], [R0, R1], pc=1),
        loss(R1, 4, rec=True, requester="s"),
        adopt("r", 5, 512, pc=1),
    ]
    lin = Lineage(ev)
    ini, res = lin[("r", 0)], lin[("r", 1)]
    assert (ini["episode"], ini["j_enter"], ini["j_adopt"], ini["class"]) == \
        ("INITIAL", 0, 0, "zero->zero")
    assert (res["episode"], res["j_enter"], res["j_adopt"], res["class"]) == \
        ("RESUME", 1024, 512, "shallower")
    assert res["other_request_allocation_losses"] == 1
    # the INITIAL window closed at its adoption: the later loss is not counted there
    assert ini["depth_decreasing_losses"] == 0
    lin.assert_agree()


def test_own_allocation_loss_is_not_attributed_to_another_request():
    ev = [
        pub(A0, 1), pub(R0, 1, rec=True),
        enter("x", 2, [A0], [R0]),
        loss(R0, 3, rec=True, requester="x"),
        adopt("x", 4, 0),
    ]
    lin = Lineage(ev)
    assert (lin["x"]["class"], lin["x"]["depth_decreasing_losses"],
            lin["x"]["other_request_allocation_losses"]) == ("shallower", 1, 0)
    assert lin.query("SELECT shallower_with_other_request_loss AS k FROM run_summary") == \
        [{"k": 0}]
    lin.assert_agree()


def test_d0_grid_16_1792():
    # prompt 3,600 tokens: 225 blocks of 16, checkpoints at 1,792 and 3,584 (both valid).
    # Blocks 0..149 valid (2,400 tokens): J_enter = 1,792, A_max 1,792, R_max 3,584.
    # In the window blocks 150..224 are published in order; J reaches 3,584 when block 223
    # (tokens 3,568..3,584) lands. Block 224 lies beyond the last checkpoint and moves nothing.
    blocks = [0x1000 + i for i in range(225)]
    c1, c2 = 0x2001, 0x2002
    ev = [pub(h, 1) for h in blocks[:150]] + [pub(c1, 1, rec=True), pub(c2, 1, rec=True)]
    ev += [enter("d", 2, blocks, [c1, c2])]
    ev += [pub(h, 3, rid="q") for h in blocks[150:]]
    ev += [adopt("d", 4, 3584)]
    lin = Lineage(ev, D0)
    d = lin["d"]
    assert (d["j_enter"], d["a_max_entry"], d["r_max_entry"]) == (1792, 1792, 3584)
    assert (d["j_adopt"], d["class"], d["depth_increasing_publications"]) == (3584, "deeper", 1)
    (chg,) = lin.query("SELECT * FROM depth_changes")
    assert (chg["hash"], chg["j_before"], chg["j_after"]) == (blocks[223], 1792, 3584)
    assert (d["a_max_m0"], d["r_max_m0"]) == (3584, 3584)
    lin.assert_agree()


def test_salted_request_never_hits():
    # The shared prefix is fully cached, but the salted request's keys mix in its salt: no
    # entry of its chain was ever published, so every depth is 0 at every cut.
    salted_a = [0xFACE0000 | i for i in range(3)]
    salted_r = [0xFACE1000 | i for i in range(3)]
    ev = [pub(A0, 1), pub(A1, 1), pub(A2, 1), pub(R0, 1, rec=True), pub(R1, 1, rec=True),
          pub(R2, 1, rec=True),
          enter("plain", 2, [A0, A1, A2], [R0, R1, R2]),
          enter("salted", 2, salted_a, salted_r),
          adopt("plain", 3, 1536), adopt("salted", 3, 0)]
    lin = Lineage(ev)
    s = lin["salted"]
    assert (s["j_enter"], s["j_adopt"], s["class"]) == (0, 0, "zero->zero")
    assert (s["a_max_m0"], s["a_max_m1"], s["r_max_m0"], s["r_max_m1"], s["r_max_exact"]) == \
        (0, 0, 0, 0, 0)
    assert lin["plain"]["class"] == "positive-equal"
    lin.assert_agree()
