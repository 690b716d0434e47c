"""The embedded tiny Falcon-H1: deterministic bytes per seed, a tokenizer transformers loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridmem.engines.tiny_model import (
    EOS_ID,
    META_NAME,
    MODEL_VERSION,
    TINY_GRID_TOKENS,
    VOCAB_SIZE,
    build_tiny_model,
    grid_tokens,
    resolve_model,
    words,
)
from hybridmem.geometry import load_geometry
from hybridmem.units import derive_units


def test_same_seed_same_bytes_other_seed_other_weights(tiny_model: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    first = build_tiny_model(tiny_model, seed=0)  # reuses the session build
    assert not first.built, "a matching build must be reused, not rebuilt"
    assert again.digest == first.digest
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (again.path / name).read_bytes() == (tiny_model / name).read_bytes(), name
    assert other.digest != first.digest
    tokenizer = (tiny_model / "tokenizer.json").read_bytes()
    assert (other.path / "tokenizer.json").read_bytes() == tokenizer


def test_config_is_a_small_falcon_h1_hybrid(tiny_model: Path) -> None:
    cfg = json.loads((tiny_model / "config.json").read_text())
    # every layer: attention + Mamba2 side by side -> vLLM builds one attention and one Mamba group
    assert cfg["architectures"] == ["FalconH1ForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (128, 2)
    assert (cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_d_state"]) == (20, 16, 64)
    assert cfg["vocab_size"] == VOCAB_SIZE
    # the shaping lives in the weights; every multiplier stays 1 (vLLM and HF read the same)
    assert cfg["ssm_multipliers"] == [1.0] * 5 and cfg["ssm_out_multiplier"] == 1.0


def test_geometry_mirrors_falcon_h1_7b_on_the_64_token_grid(tiny_model: Path) -> None:
    geo = load_geometry(str(tiny_model))
    #  a = 2 x 2 KV heads x 32 x 4 B = 512;  s = 320 x 64 x 4 B = 81,920;  c = 3 x 448 x 4 B = 5,376
    assert (geo.attn_bytes_per_token, geo.ssm_bytes, geo.conv_bytes) == (512, 81_920, 5_376)
    assert (geo.d_ssm, geo.conv_dim, geo.composite_bytes) == (320, 448, 87_296)
    units = derive_units(geo, grid_tokens=TINY_GRID_TOKENS)
    #  P = 64 x 512 = 32 KiB; s / P = 2.5 -> 3 members, the last half full (Falcon-H1-7B: 3 x P)
    assert units.page_bytes == 32_768 and units.ssm_members == 3
    assert geo.ssm_bytes - 2 * units.page_bytes == units.page_bytes // 2
    #  conv 5,376 B -> 8-KiB slot, 4 slots per slab (Falcon-H1-7B: 32 KiB, 16 per slab)
    assert (units.conv_slot_bytes, units.slots_per_slab) == (8_192, 4)
    #  D0: u = 16 ceil(87,296 / (16 x 512)) = 176 tokens; interval 256 = 16 attention units of 16
    assert (units.uniform_tokens, units.d0_interval_tokens) == (176, 256)
    assert units.d0_interval_tokens // units.d0_attn_tokens == 16
    assert units.s0_page_bytes == 87_296 and units.d0_attn_unit_bytes == 8_192


def test_grid_is_written_beside_the_config(tiny_model: Path, tmp_path: Path) -> None:
    meta = json.loads((tiny_model / META_NAME).read_text())
    assert meta["grid_tokens"] == TINY_GRID_TOKENS == 64 and meta["version"] == MODEL_VERSION
    assert grid_tokens(tiny_model) == 64
    assert grid_tokens(tmp_path) is None  # a model without hybridmem.json declares no grid
    (tmp_path / META_NAME).write_text('{"grid_tokens": 50}')
    with pytest.raises(ValueError, match="multiple of 16, got 50"):
        grid_tokens(tmp_path)


def test_a_build_of_another_version_is_not_reused(tiny_model: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    stamp = copy / "hybridmem-build.json"
    meta = json.loads(stamp.read_text())
    assert not build_tiny_model(copy, seed=0).built  # same version: reused
    stamp.write_text(json.dumps({**meta, "version": MODEL_VERSION - 1}))
    assert build_tiny_model(copy, seed=0).built  # a stale version is rebuilt


def test_tokenizer_round_trips_words(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    text = " ".join(words()[:5])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == [4, 5, 6, 7, 8]
    assert tok.decode(ids) == text
    assert tok.eos_token_id == EOS_ID
    assert tok("zzzz", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_bad_model_path_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(tmp_path)
    with pytest.raises(ValueError, match="seed"):
        build_tiny_model(tmp_path / "x", seed=-1)
