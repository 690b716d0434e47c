"""SQL and the scalar replay agree on every episode of random and simulated traces."""

import random

import pytest

from hybridmem.events import Cause
from lineage.synth import D0_SYNTH, SynthConfig, synthesize

from .helpers import D0, S2, Lineage, adopt, enter, loss, pub


def _random_events(seed: int, meta: dict) -> list:
    """A messy trace: few keys (so they collide across chains), republications, losses of
    invalid entries, duplicate entries/adoptions, adoptions before entries, unknown steps."""
    rng = random.Random(seed)
    per_ckpt = meta["recurrent_grid_tokens"] // meta["attention_grid_tokens"]
    att_keys = list(range(1, 12))
    rec_keys = list(range(100, 106))
    events, step, waiting = [], 0, []
    for _ in range(rng.randint(20, 80)):
        step += rng.random() < 0.4
        r = rng.random()
        if r < 0.35:
            events.append(pub(rng.choice(att_keys), step, rid=f"q{rng.randrange(4)}"))
        elif r < 0.5:
            events.append(pub(rng.choice(rec_keys), step, rec=True, rid=f"q{rng.randrange(4)}"))
        elif r < 0.7:
            rec = rng.random() < 0.4
            events.append(loss(rng.choice(rec_keys if rec else att_keys), step, rec=rec,
                               cause=rng.choice([Cause.ALLOCATION, Cause.SLAB_RECLAIM,
                                                 Cause.EVICTION]),
                               requester=rng.choice(["", "e0", "e1", "zz"])))
        elif r < 0.85:
            rid, pc = f"e{rng.randrange(6)}", rng.randrange(2)
            nrec = rng.randrange(0, 4)
            nattn = max(0, nrec * per_ckpt + rng.randint(-2, 2)) if per_ckpt < 8 else \
                rng.randrange(0, 3 * per_ckpt)
            chain = [rng.choice(att_keys) for _ in range(min(nattn, 40))]
            events.append(enter(rid, step, chain, [rng.choice(rec_keys) for _ in range(nrec)],
                                pc=pc))
            waiting.append((rid, pc))
        elif waiting or rng.random() < 0.2:
            rid, pc = rng.choice(waiting) if waiting else ("ghost", 0)
            s = -1 if rng.random() < 0.1 else step
            events.append(adopt(rid, s, rng.randrange(0, 4) * meta["recurrent_grid_tokens"],
                                pc=pc))
    return events


@pytest.mark.parametrize("seed", range(40), ids=lambda s: f"seed{s}")
def test_random_traces_agree(seed):
    meta = S2 if seed % 2 else {"organization": "X", "attention_grid_tokens": 256,
                                "recurrent_grid_tokens": 1024}
    lin = Lineage(_random_events(seed, meta), meta)
    lin.assert_agree()


@pytest.mark.parametrize("org", ["S2", "D0"])
def test_simulated_runs_agree(org):
    kw = D0_SYNTH if org == "D0" else {}
    cfg = SynthConfig(requests=120 if org == "D0" else 300, seed=5, arrival_rate=1.0, **kw)
    lin = Lineage(None, table=synthesize(cfg))
    lin.assert_agree()
    classes = {r["class"] for r in lin.rows.values()}
    assert {"zero->zero", "positive-equal", "shallower"} <= classes, classes
    resumes = [k for k in lin.rows if k[1] > 0]
    assert resumes, "the simulated run should preempt and resume at least one request"


def test_d0_meta_constant():
    assert D0["recurrent_grid_tokens"] % D0["attention_grid_tokens"] == 0


def test_sampled_replay_equals_the_full_replay_on_its_episodes():
    import pyarrow as pa
    import pyarrow.compute as pc

    from lineage import views
    from lineage.replay import (
        compare,
        episode_requests,
        replay,
        replay_row,
        restrict,
        sample_requests,
    )

    table = synthesize(SynthConfig(requests=300, seed=5, arrival_rate=1.0))
    full = replay(table)
    ids = episode_requests(table)
    chosen = sample_requests(ids, 40)
    assert len(chosen) == 40 and chosen == sample_requests(list(reversed(ids)), 40)
    part = replay(table, requests=chosen)
    keys = sorted(part.episodes)
    assert keys == sorted(k for k in full.episodes if k[0] in chosen)
    assert [replay_row(part.episodes[k]) for k in keys] == \
        [replay_row(full.episodes[k]) for k in keys]
    assert restrict(table, chosen).num_rows < table.num_rows / 2  # the point of restricting
    con = views.connect(table)
    rel = con.sql("SELECT * FROM episode_lineage")
    rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    con.close()
    got = compare(rows, part, requests=chosen)
    assert got.complete and got.episodes == len(keys)
    # negative control: without the supply rows of the sampled chains the replay differs, and
    # compare() says so
    own = restrict(table, chosen)
    bare = replay(own.filter(pc.is_in(own.column("kind"),
                                      value_set=pa.array(["waiting_entry", "adoption"]))))
    assert any(replay_row(bare.episodes[k]) != replay_row(full.episodes[k]) for k in keys)
    assert not compare(rows, bare, requests=chosen).complete


def _ranked_sample(ids, limit):
    """The sample's definition: the ``limit`` smallest (CRC-32, id) pairs."""
    import zlib

    return frozenset(sorted(ids, key=lambda r: (zlib.crc32(r.encode()), r))[:limit])


def test_sample_requests_is_the_smallest_crc_then_id():
    from lineage.replay import sample_requests

    rng = random.Random(11)
    # 'plumless' and 'buckeroo' share a CRC-32: the cut falls inside a tie in some draws
    for _ in range(200):
        ids = [f"r{rng.randint(0, 10 ** rng.randint(1, 5))}" for _ in range(rng.randint(1, 300))]
        ids += ["plumless", "buckeroo"] + rng.sample(ids, min(len(ids), rng.randint(0, 20)))
        limit = rng.randint(1, 320)
        assert sample_requests(ids, limit) == _ranked_sample(ids, limit)
    # negative control: ties broken the other way pick a different set at the tie
    tie = ["plumless", "buckeroo"]
    assert sample_requests(tie, 1) == {"buckeroo"}
    assert frozenset(sorted(tie, reverse=True)[:1]) != sample_requests(tie, 1)
    with pytest.raises(ValueError, match="limit"):
        sample_requests(tie, 0)
