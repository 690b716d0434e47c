"""``reuse_diagnosis`` / ``reuse_causes`` and ``hybridmem diagnose``: each cause on a constructed
trace with a negative control (the same trace with that cause removed gives 0 tokens for it),
the sum invariant, the token-id shared prefix, the CLI's --json and its refusals.

Traces: a producer ``a`` publishes its blocks and checkpoints, a consumer ``b`` shares a prefix
with it and adopts some of it. Grid 512/512 unless the test says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from hybridmem.events import Cause, Event, EventKind, StateKind
from lineage import views
from lineage.diagnose import CAUSES, shared_prefixes
from lineage.synth import SynthConfig, synthesize
from lineage.table import events_to_table

S2 = {"organization": "S2", "attention_grid_tokens": 512, "recurrent_grid_tokens": 512}
VLLM = {"organization": "vllm", "attention_grid_tokens": 1568, "recurrent_grid_tokens": 1568}
CAUSE_COLUMNS = ("grid_tokens", "never_published_tokens", "not_yet_published_tokens",
                 "lost_tokens", "attention_lost_tokens", "cap_tokens", "other_tokens")


def pub(h: int, step: int, rec: bool = False, rid: str = "a") -> Event:
    return Event(EventKind.PUBLICATION, step=step, request_id=rid, hash=h,
                 state_kind=StateKind.RECURRENT if rec else StateKind.ATTENTION)


def loss(h: int, step: int, rec: bool = False, cause: Cause = Cause.ALLOCATION,
         requester: str = "x") -> Event:
    return Event(EventKind.LOSS, step=step, hash=h, cause=cause, requester=requester,
                 state_kind=StateKind.RECURRENT if rec else StateKind.ATTENTION)


def enter(rid: str, step: int, tokens: int, chain: Sequence[int], rchain: Sequence[int]
          ) -> Event:
    return Event(EventKind.WAITING_ENTRY, step=step, request_id=rid, depth=tokens,
                 chain=tuple(chain), recurrent_chain=tuple(rchain))


def adopt(rid: str, step: int, depth: int) -> Event:
    return Event(EventKind.ADOPTION, step=step, request_id=rid, depth=depth)


def producer(checkpoints: Sequence[int] = (11, 12, 13), blocks: Sequence[int] = (1, 2, 3),
             tokens: int = 1600) -> list[Event]:
    """``a``: three blocks, checkpoints at 512, 1024, 1536; publishes what it is given."""
    return [enter("a", 1, tokens, [1, 2, 3], [11, 12, 13]), adopt("a", 1, 0),
            *[pub(h, 2) for h in blocks], *[pub(h, 2, rec=True) for h in checkpoints]]


B_CHAIN = ([1, 2, 9], [11, 12, 19])  # b shares a's first two blocks: 1,024 tokens by chain


def diagnosis(events: list[Event], meta: dict = S2, token_prefix=views.NO_TOKEN_PREFIX
              ) -> dict[str, dict]:
    con = views.connect(events_to_table(events, meta), materialize=True,
                        only=frozenset({"reuse_diagnosis"}), token_prefix=token_prefix)
    rel = con.execute("SELECT * FROM reuse_diagnosis")
    cols = [d[0] for d in rel.description]
    rows = {r[0]: dict(zip(cols, r, strict=True)) for r in rel.fetchall()}
    con.close()
    for r in rows.values():  # every row: the causes account for all of shared - reused
        assert sum(r[c] for c in CAUSE_COLUMNS) == r["unreused_tokens"]
        assert r["unreused_tokens"] == r["shared_tokens"] - r["reused_tokens"]
    return rows


# --- each cause, with its negative control ------------------------------------------------------

def test_grid_names_the_coarse_grid():
    # vLLM-like inflated block: b shares 600 tokens with a, no boundary inside them
    events = [enter("a", 1, 1400, [], []), adopt("a", 1, 0),
              enter("b", 3, 1000, [], []), adopt("b", 3, 0)]
    rows = diagnosis(events, VLLM, (["a", "b"], [0, 600], ["", "a"]))
    b = rows["b"]
    assert (b["shared_tokens"], b["reused_tokens"], b["grid_tokens"]) == (600, 0, 600)
    assert b["cause"] == "grid" and "grid 1568 tokens" in b["detail"]
    assert b["shared_source"] == "tokens" and b["shared_with"] == "a"
    # control: a prefix that reaches the boundary, whose checkpoint a published and b adopted
    events = [enter("a", 1, 2000, [1], [11]), adopt("a", 1, 0), pub(1, 2), pub(11, 2, rec=True),
              enter("b", 3, 2000, [1], [11]), adopt("b", 3, 1568)]
    b = diagnosis(events, VLLM, (["a", "b"], [0, 1568], ["", "a"]))["b"]
    assert (b["shared_tokens"], b["grid_tokens"], b["unreused_tokens"]) == (1568, 0, 0)


def test_never_published():
    # a's chunk ended at 1,536: no checkpoint at 512 or 1,024 was saved
    events = producer(checkpoints=[13]) + [enter("b", 3, 1500, *B_CHAIN), adopt("b", 3, 0)]
    b = diagnosis(events)["b"]
    assert (b["shared_tokens"], b["never_published_tokens"], b["cause"]) == \
        (1024, 1024, "never-published")
    assert "no earlier request published a checkpoint at 1024" in b["detail"]
    # b's own publications after its lookup do not make the shared checkpoints published
    events = producer(checkpoints=[13]) + [enter("b", 3, 1500, *B_CHAIN), adopt("b", 3, 0),
                                           pub(11, 4, rec=True, rid="b")]
    b = diagnosis(events)["b"]
    assert (b["never_published_tokens"], b["not_yet_published_tokens"]) == (1024, 0)
    events = producer() + [enter("b", 3, 1500, *B_CHAIN), adopt("b", 3, 1024)]
    b = diagnosis(events)["b"]
    assert (b["never_published_tokens"], b["unreused_tokens"]) == (0, 0)


def test_not_yet_published():
    # b looks up before a has computed anything
    events = [enter("a", 1, 1600, [1, 2, 3], [11, 12, 13]), adopt("a", 1, 0),
              enter("b", 1, 1500, *B_CHAIN), adopt("b", 1, 0),
              *[pub(h, 2) for h in (1, 2, 3)], *[pub(h, 2, rec=True) for h in (11, 12, 13)]]
    b = diagnosis(events)["b"]
    assert (b["not_yet_published_tokens"], b["never_published_tokens"]) == (1024, 0)
    assert "after the lookup (step 2, by a)" in b["detail"]
    # control: the same publications before b's lookup
    events = producer() + [enter("b", 3, 1500, *B_CHAIN), adopt("b", 3, 1024)]
    assert diagnosis(events)["b"]["not_yet_published_tokens"] == 0


def test_lost_names_the_allocation():
    events = producer() + [loss(12, 3, rec=True, requester="c"),
                           enter("b", 4, 1500, *B_CHAIN), adopt("b", 4, 512)]
    b = diagnosis(events)["b"]
    assert (b["lost_tokens"], b["reused_tokens"], b["cause"]) == (512, 512, "lost")
    assert "lost before the lookup to c's allocation (allocation, step 3)" in b["detail"]
    events = producer() + [enter("b", 4, 1500, *B_CHAIN), adopt("b", 4, 1024)]
    assert diagnosis(events)["b"]["lost_tokens"] == 0


def test_lost_names_an_eviction_without_requester():
    events = producer() + [loss(12, 3, rec=True, cause=Cause.EVICTION, requester=""),
                           enter("b", 4, 1500, *B_CHAIN), adopt("b", 4, 512)]
    b = diagnosis(events)["b"]
    assert b["lost_tokens"] == 512 and "(eviction, step 3)" in b["detail"]


def test_attention_lost():
    # the checkpoint at 1,024 stays valid, the attention block [512, 1024) does not
    events = producer() + [loss(2, 3, cause=Cause.EVICTION, requester=""),
                           enter("b", 4, 1500, *B_CHAIN), adopt("b", 4, 512)]
    b = diagnosis(events)["b"]
    assert (b["attention_lost_tokens"], b["lost_tokens"], b["cause"]) == \
        (512, 0, "attention-lost")
    assert "attention prefix only to 512" in b["detail"]
    events = producer() + [enter("b", 4, 1500, *B_CHAIN), adopt("b", 4, 1024)]
    assert diagnosis(events)["b"]["attention_lost_tokens"] == 0


def test_cap():
    # b is a's prompt again, exactly two grid units: the boundary at L = 1,024 is not adoptable
    events = producer(tokens=1024) + [enter("b", 3, 1024, [1, 2], [11, 12]), adopt("b", 3, 512)]
    b = diagnosis(events)["b"]
    assert (b["shared_tokens"], b["cap_tokens"], b["grid_tokens"]) == (1023, 511, 0)
    assert "past the L - 1 cap" in b["detail"]
    # control: one token longer, the boundary at 1,024 lies below L - 1 and is adopted
    events = producer(tokens=1024) + [enter("b", 3, 1025, [1, 2], [11, 12]), adopt("b", 3, 1024)]
    b = diagnosis(events)["b"]
    assert (b["shared_tokens"], b["cap_tokens"], b["unreused_tokens"]) == (1024, 0, 0)


def test_other_counts_what_no_cause_explains():
    # every boundary jointly valid at the lookup, yet nothing adopted
    events = producer() + [enter("b", 3, 1500, *B_CHAIN), adopt("b", 3, 0)]
    b = diagnosis(events)["b"]
    assert (b["other_tokens"], b["cause"]) == (1024, "other")
    assert "valid at the lookup, not adopted" in b["detail"]
    # a request that reused more than any earlier one shared: negative, still summed
    events = [enter("a", 1, 1600, [1, 2], [11, 12]), adopt("a", 1, 0), pub(1, 2), pub(2, 2),
              pub(11, 2, rec=True), enter("b", 3, 1500, [7, 8], [17, 18]), adopt("b", 3, 512)]
    b = diagnosis(events)["b"]
    assert (b["shared_tokens"], b["other_tokens"]) == (0, -512)


# --- sums over whole runs ---------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [
    SynthConfig(requests=120, seed=3),
    SynthConfig(requests=120, seed=4, organization="D0", attention_grid_tokens=16,
                recurrent_grid_tokens=1792, recurrent_pool_units=40, pool_units=1500,
                slab_checkpoints=0),
], ids=["S2", "D0"])
def test_causes_sum_to_the_unreused_tokens_and_nothing_is_unexplained(cfg):
    con = views.connect(synthesize(cfg), materialize=True,
                        only=frozenset({"reuse_diagnosis", "reuse_causes"}))
    unreused, shared, reused = con.execute(
        "SELECT sum(unreused_tokens), sum(shared_tokens), sum(reused_tokens) "
        "FROM reuse_diagnosis").fetchone()
    causes = dict(con.execute("SELECT cause, tokens FROM reuse_causes").fetchall())
    con.close()
    assert tuple(causes) == CAUSES
    assert unreused == shared - reused > 0
    assert sum(causes.values()) == unreused
    assert causes["other"] == 0  # the synthetic runs adopt exactly J at the lookup
    if cfg.organization == "D0":
        assert causes["grid"] > 0  # 1,792-token checkpoints inside shared contexts
    else:
        assert causes["lost"] > 0  # LRU reclaim under pressure


# --- the shared prefix on token ids -----------------------------------------------------------

def test_shared_prefixes_on_token_ids():
    ids, raw, holders = shared_prefixes(
        ["r1", "r2", "r3", "r4"],
        {"r1": [5, 9, 9, 3], "r2": [5, 9, 9, 4, 7], "r3": [5, 9, 1], "r4": [6]})
    assert ids == ["r1", "r2", "r3", "r4"]
    assert raw == [0, 3, 2, 0]
    assert holders == ["", "r1", "r1", ""]
    # control: a request compared with later ones only gives 0 (entry order matters)
    assert shared_prefixes(["r2", "r1"], {"r1": [5, 9], "r2": [5, 9, 1]})[1] == [0, 2]


def test_chain_fallback_measures_to_the_block():
    events = producer() + [enter("b", 3, 1500, *B_CHAIN), adopt("b", 3, 1024)]
    b = diagnosis(events)["b"]
    assert (b["shared_source"], b["shared_tokens"], b["shared_with"]) == ("chain", 1024, "a")
    assert diagnosis(events)["a"]["shared_tokens"] == 0


# --- the CLI ----------------------------------------------------------------------------------

def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_json_is_alone_on_stdout(tmp_path, capsys):
    path = tmp_path / "run.parquet"
    events = producer() + [loss(12, 3, rec=True, requester="c"),
                           enter("b", 4, 1500, *B_CHAIN), adopt("b", 4, 512)]
    pq.write_table(events_to_table(events, S2), path)
    plot = tmp_path / "causes.png"
    code, out, err = _cli(capsys, "diagnose", str(path), "--json", "--plot", str(plot),
                          "--out", str(tmp_path / "d"))
    assert code == 0, err
    doc = json.loads(out)
    assert [c["cause"] for c in doc["causes"]] == list(CAUSES)
    assert doc["totals"]["unreused_tokens"] == 512
    assert sum(c["tokens"] for c in doc["causes"]) == 512
    assert {r["request_id"]: r["lost_tokens"] for r in doc["requests"]} == {"a": 0, "b": 512}
    assert plot.stat().st_size > 0
    assert {p.name for p in (tmp_path / "d").iterdir()} == \
        {"diagnosis.json", "reuse_diagnosis.csv", "reuse_causes.png"}
    code, out, _ = _cli(capsys, "diagnose", str(path))
    assert code == 0 and "lost" in out and "c's allocation" in out
    code, out, _ = _cli(capsys, "lineage", "query", str(path), "--sql",
                        "SELECT cause, tokens FROM reuse_causes WHERE tokens <> 0")
    assert code == 0 and out.splitlines()[1:] == ["lost\t512"]


def test_cli_reads_the_run_directory_counters(tmp_path, capsys):
    import pyarrow as pa

    trace_dir = tmp_path / "run" / "trace"
    trace_dir.mkdir(parents=True)
    events = producer() + [enter("b-abcdefgh", 3, 1500, *B_CHAIN), adopt("b-abcdefgh", 3, 1024)]
    path = trace_dir / "trace.parquet"
    pq.write_table(events_to_table(events, S2), path)
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"prefix_hit_tokens": 1024}))
    pq.write_table(pa.table({"request_id": ["a", "b"], "engine_request_id": ["a", "b-abcdefgh"],
                             "cached_tokens": [0, 1024]}), tmp_path / "run" / "results.parquet")
    code, out, err = _cli(capsys, "diagnose", str(path), "--json")
    assert code == 0, err
    eng = json.loads(out)["engine"]
    assert eng["agree"] is True and eng["requests_differing"] == 0
    # control: vLLM counted a different hit for b -> disagreement, exit 1
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"prefix_hit_tokens": 512}))
    code, out, _ = _cli(capsys, "diagnose", str(path), "--json")
    assert code == 1 and json.loads(out)["engine"]["agree"] is False
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"prefix_hit_tokens": 1024}))
    # the tracing hooks' PrefixCacheStats file: INITIAL queries = prompt tokens, hits = reused
    side = trace_dir / "trace.parquet.prefix_cache.json"
    stats = {"requests": 2, "queries": 3100, "hits": 1024, "preempted_requests": 0,
             "preempted_queries": 0, "preempted_hits": 0}
    side.write_text(json.dumps(stats))
    code, out, _ = _cli(capsys, "diagnose", str(path))
    assert code == 0 and "PrefixCacheStats queries 3,100 hits 1,024" in out
    side.write_text(json.dumps(dict(stats, hits=1536)))
    code, out, _ = _cli(capsys, "diagnose", str(path))
    assert code == 1 and "agree: False" in out


@pytest.mark.vllm
def test_stock_vllm_run_diagnosed_and_vllm_counters_agree(tmp_path, capsys):
    """vLLM's real scheduler (model-free simulation) with its own manager, traced: every
    unreused token has a cause, none unexplained, and vLLM's own counters equal the trace's."""
    from hybridmem.sim.run import SimConfig, run_sim

    run_sim(SimConfig(org="vllm", budget="b12", out=tmp_path, trace_dir=tmp_path / "trace",
                      requests=16, rate=4.0, max_model_len=2048, cap=8))
    code, out, err = _cli(capsys, "diagnose", str(tmp_path / "trace" / "trace.hmt"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["shared_source"].startswith("tokens")
    assert doc["meta"]["recurrent_grid_tokens"] == 1568
    causes = {c["cause"]: c["tokens"] for c in doc["causes"]}
    assert sum(causes.values()) == doc["totals"]["unreused_tokens"] > 0
    assert causes["other"] == 0 and causes["grid"] > 0
    eng = doc["engine"]
    assert eng["agree"] is True and eng["requests_differing"] == 0
    assert eng["prefix_cache_stats"]["hits"] == doc["totals"]["reused_tokens"]
    assert eng["prefix_cache_stats"]["queries"] == doc["totals"]["prompt_tokens"]


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    code, out, err = _cli(capsys, "diagnose", str(tmp_path / "missing.hmt"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    path = tmp_path / "bad.parquet"
    meta = dict(S2, verdict={"accepted": False, "reason": "END missing"})
    pq.write_table(events_to_table(producer(), meta), path)
    code, _, err = _cli(capsys, "diagnose", str(path))
    assert code == 2 and "END missing" in err and len(err.strip().splitlines()) == 1
    code, _, err = _cli(capsys, "diagnose", str(path), "--allow-unverified")
    assert code == 0
    code, _, err = _cli(capsys, "diagnose", str(path), "--allow-unverified", "--workload",
                        str(tmp_path / "nope.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_an_imported_kv_event_stream_has_no_requests_to_diagnose(tmp_path, capsys):
    import msgpack

    stream = tmp_path / "kv.msgpack"
    stream.write_bytes(
        msgpack.packb([1.0, [["BlockStored", [5, 6], None, [], 16, None, "GPU"]]])
        + msgpack.packb([2.0, [["BlockRemoved", [6], "GPU"]]]))
    table = tmp_path / "kv.parquet"
    assert _cli(capsys, "lineage", "import-vllm", str(stream), str(table))[0] == 0
    code, out, _ = _cli(capsys, "diagnose", str(table))
    assert code == 0 and "supply side only (2 publications, 1 losses)" in out
    doc = json.loads(_cli(capsys, "diagnose", str(table), "--json")[1])
    assert doc["totals"]["requests"] == 0 and doc["requests"] == []
