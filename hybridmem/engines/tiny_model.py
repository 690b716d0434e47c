"""The embedded default model: a tiny Falcon-H1 built from a config with seeded random weights.

Real checkpoints (Falcon-H1-7B) are used by path on GPU; this model exists so that every serving
path (vLLM on CPU, transformers as the greedy reference) runs on a laptop in seconds. It has the
Falcon-H1 structure that matters for memory organization -- every layer holds an attention block
and a Mamba2 mixer side by side, so vLLM builds one attention KV-cache group and one Mamba group --
at toy sizes:

==================  =====  ==================================================
hidden              128
layers              2      (each: attention + Mamba2 in parallel)
attention heads     4      2 KV heads, head_dim 32
Mamba heads         8      head dim 16 (d_ssm 128), d_state 16, 1 group, d_conv 4
vocabulary          512    word-level: 4 specials + 508 three-letter words
context             2048
dtype               float32
==================  =====  ==================================================

``build_tiny_model(out, seed)`` is deterministic: the same seed gives the same bytes in every file
(weights via ``torch.manual_seed``; the tokenizer is a fixed word list).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

DEFAULT_DIR = Path("data/models/tiny-falcon-h1")
DEFAULT_SEED = 0
VOCAB_SIZE = 512
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MAX_MODEL_LEN = 2048
_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json")
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


class TinyModel(NamedTuple):
    path: Path
    seed: int
    built: bool  # False when an existing, matching build was reused
    digest: str  # sha256 over the files, in _FILES order


def config_kwargs() -> dict[str, object]:
    """The FalconH1Config arguments of the tiny model (one place, so tests can read them)."""
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        mamba_d_ssm=128,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=1,
        mamba_chunk_size=64,
        max_position_embeddings=MAX_MODEL_LEN,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        dtype="float32",
    )


def words() -> list[str]:
    """The 508 words of the vocabulary after the specials: ``bab, bac, ...`` (fixed order)."""
    out = [c1 + v + c2 for c1 in _CONSONANTS for v in _VOWELS for c2 in _CONSONANTS]
    return out[: VOCAB_SIZE - len(SPECIALS)]


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for w in words():
        vocab[w] = len(vocab)
    assert len(vocab) == VOCAB_SIZE, f"vocabulary has {len(vocab)} entries; this indicates a bug"
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "model_max_length": MAX_MODEL_LEN, "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for name in _FILES:
        h.update(name.encode())
        h.update((path / name).read_bytes())
    return h.hexdigest()


def _stamp(path: Path) -> Path:
    return path / "hybridmem-build.json"


def build_tiny_model(out: Path | str = DEFAULT_DIR, seed: int = DEFAULT_SEED,
                     force: bool = False) -> TinyModel:
    """Build (or reuse) the tiny Falcon-H1 in ``out``. Reuses a complete build of the same seed."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    out = Path(out)
    stamp = _stamp(out)
    if not force and stamp.exists() and all((out / f).exists() for f in _FILES):
        meta = json.loads(stamp.read_text())
        if meta.get("seed") == seed and meta.get("digest") == _digest(out):
            return TinyModel(out, seed, False, meta["digest"])

    import torch
    from transformers import FalconH1Config, FalconH1ForCausalLM, GenerationConfig

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    try:
        config = FalconH1Config(**config_kwargs())
        config.architectures = ["FalconH1ForCausalLM"]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = FalconH1ForCausalLM(config).eval()
        model.save_pretrained(tmp, safe_serialization=True)
        gen = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        gen.save_pretrained(tmp)
        _build_tokenizer(tmp)
        digest = _digest(tmp)
        _stamp(tmp).write_text(json.dumps({"seed": seed, "digest": digest}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return TinyModel(out, seed, True, digest)


def resolve_model(model: str | Path | None, data_dir: Path | None = None) -> Path:
    """``None`` or ``"tiny"``: the embedded model (built if missing); otherwise a model path."""
    if model is None or str(model) == "tiny":
        return build_tiny_model(data_dir or DEFAULT_DIR).path
    path = Path(model)
    if not (path / "config.json").exists():
        raise ValueError(f"model {str(model)!r}: no config.json there (use 'tiny' or a model dir)")
    return path
