"""vLLM KVEventBatch msgpack (both encodings) into the event table, then lineage totals."""

import msgpack
import pytest

from hybridmem.events import hash64
from lineage import views
from lineage.vllm_events import VllmEventError, batches_to_table, decode_payloads, decode_stream


def _array_form():
    # older vLLM: array_like structs, the tag first; hashes as ints
    b0 = [1.5, [["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"]]]
    b1 = [2.0, [["BlockStored", [13], 12, list(range(16)), 16, None, "GPU"],
                ["BlockRemoved", [11], "GPU"]]]
    b2 = [2.5, [["AllBlocksCleared"]]]
    return [msgpack.packb(b) for b in (b0, b1, b2)]


def _map_form():
    # newer vLLM: map structs with a "type" tag; bytes hashes; a hybrid Mamba group (idx 1)
    h = [bytes([i]) * 32 for i in range(4)]
    b0 = {"ts": 10.0, "events": [
        {"type": "BlockStored", "block_hashes": [h[0], h[1]], "parent_block_hash": None,
         "token_ids": [], "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
        {"type": "BlockStored", "block_hashes": [h[1]], "parent_block_hash": None,
         "token_ids": [], "block_size": 32, "lora_id": None, "medium": "GPU",
         "lora_name": None, "group_idx": 1, "kv_cache_spec_kind": "mamba"},
        {"type": "BlockStored", "block_hashes": [h[2]], "parent_block_hash": None,
         "token_ids": [], "block_size": 16, "lora_id": None, "medium": "CPU",
         "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}]}
    b1 = {"ts": 11.0, "events": [
        {"type": "BlockRemoved", "block_hashes": [h[1]], "medium": "GPU", "group_idx": 1}],
        "data_parallel_rank": 0}
    return [msgpack.packb(b) for b in (b0, b1)], h


def test_array_form_depths_and_clear():
    table = batches_to_table(decode_payloads(_array_form()))
    rows = table.select(["seq", "step", "kind", "hash", "depth", "state_kind", "cause"]).to_pylist()
    # stored 11 (16), 12 (32); then 13 under parent 12 (48); 11 removed; clear drops 12 and 13
    assert [(r["kind"], r["hash"], r["depth"], r["step"], r["cause"]) for r in rows] == [
        ("publication", 11, 16, 0, "none"), ("publication", 12, 32, 0, "none"),
        ("publication", 13, 48, 1, "none"), ("loss", 11, 16, 1, "eviction"),
        ("loss", 12, 32, 2, "invalidation"), ("loss", 13, 48, 2, "invalidation")]
    assert table.column("ts_ns").to_pylist()[0] == 1_500_000_000
    # only the two views read, their heavy views as tables (all views unmaterialized: ~8 s)
    con = views.connect(table, only=frozenset({"run_summary", "table_checks"}), materialize=True)
    s = con.sql("SELECT episodes, publications, losses FROM run_summary").fetchall()
    assert s == [(0, 3, 3)]
    checks = con.sql("SELECT seq_gaps, duplicate_seqs FROM table_checks").fetchall()
    assert checks == [(0, 0)]


def test_map_form_hybrid_groups_and_medium_filter():
    payloads, h = _map_form()
    table = batches_to_table(decode_stream(b"".join(payloads)))
    rows = table.select(["kind", "hash", "state_kind", "depth"]).to_pylist()
    # the CPU-tier store is dropped; the Mamba group's removal keeps its recurrent kind
    assert rows == [
        {"kind": "publication", "hash": hash64(h[0]), "state_kind": "attention", "depth": 16},
        {"kind": "publication", "hash": hash64(h[1]), "state_kind": "attention", "depth": 32},
        {"kind": "publication", "hash": hash64(h[1]), "state_kind": "recurrent", "depth": 32},
        {"kind": "loss", "hash": hash64(h[1]), "state_kind": "recurrent", "depth": 32}]
    con = views.connect(table, only=frozenset({"_params"}))
    grids = con.sql("SELECT attention_grid_tokens, recurrent_grid_tokens FROM _params").fetchall()
    assert grids == [(16, 32)]


def test_bad_payload_is_a_caller_error():
    with pytest.raises(VllmEventError, match="KVEventBatch"):
        list(decode_payloads([msgpack.packb({"nope": 1})]))
    with pytest.raises(VllmEventError, match="unknown KV cache event"):
        list(decode_payloads([msgpack.packb([0.0, [["BlockMoved", [1]]]])]))
