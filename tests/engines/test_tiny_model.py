"""The embedded tiny Falcon-H1: deterministic bytes per seed, a tokenizer transformers loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridmem.engines.tiny_model import (
    EOS_ID,
    VOCAB_SIZE,
    build_tiny_model,
    resolve_model,
    words,
)


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
    assert (cfg["mamba_n_heads"], cfg["mamba_d_head"], cfg["mamba_d_state"]) == (8, 16, 16)
    assert cfg["vocab_size"] == VOCAB_SIZE


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
