"""The embedded default model: a tiny Falcon-H1 whose recurrent state matters, with shaped weights.

Real checkpoints (Falcon-H1-7B) are used by path on GPU; this model exists so that every serving
path (vLLM on CPU, transformers as the greedy reference) runs on a laptop in seconds. Every layer
holds an attention block and a Mamba2 mixer side by side (vLLM builds one attention KV-cache group
and one Mamba group), at toy sizes whose per-layer byte ratios mirror Falcon-H1-7B's on a 64-token
organization grid (``TINY_GRID_TOKENS``; Falcon-H1-7B uses 512):

==================  =========  =====================================  ==================
quantity            tiny       formula                                Falcon-H1-7B (512)
==================  =========  =====================================  ==================
hidden / layers     128 / 2    each layer: attention + Mamba2         3072 / 44
attention           4 heads    2 KV heads x head_dim 32, float32      2 x 128, bf16
a  (B/token/layer)  512        2 x 2 x 32 x 4                         1,024
page P              32 KiB     64 tokens x a                          512 KiB
Mamba               20 x 16    heads x head dim (d_ssm 320)           24 x 128
d_state, groups     64, 1      d_conv 4, conv_dim 320 + 2 x 64 = 448  256, 1
s  SSM state        81,920     320 x 64 x 4 B = 2.5 P -> 3 members    1,572,864 = 3 P
c  conv state       5,376      3 x 448 x 4 B -> 8-KiB slot, 4 / slab  21,504 -> 16 / slab
D0 u / interval     176 / 256  16 ceil(r / 16a); 16 attention units   1,568 / 1,792
vocabulary          512        word-level: 4 specials + 508 words
context             2048
==================  =========  =====================================  ==================

vLLM 0.32 on CPU pads its Mamba page to the attention page in 128-token steps: its own blocks for
this model are 256 tokens (the organizations use the 64-token grid).

Why the weights are shaped (``_shape_weights``). With transformers' default initialisation (every
matrix N(0, 0.02)) the Mamba branch's output has norm ~1e-3 beside attention's ~0.1 and its state
decays within a few tokens, so replacing a request's checkpoint by zeros changes no greedy token
and every equality test of state handling passes vacuously. The builder therefore overwrites, from
the same seed: in_proj rows of z, x, B, C with N(0, 1/hidden) (unit-scale projections) and the dt
rows with N(0, 0.01/hidden) so dt is mostly its bias; dt_bias so that softplus gives dt log-spaced
in [0.01, 0.1] over the heads; A = -exp(A_log) log-spaced in [1e-3, 0.1] (memory of 1/(dt |A|) =
100 .. 100,000 tokens); D = 0 (no skip path around the state); conv taps N(0, 0.09) plus 1 on the
newest tap; out_proj N(0, 0.09/d_ssm); attention q/k/v N(0, 1/hidden) and o_proj N(0, 1/hidden);
lm_head N(0, 1/hidden) (logits of unit spread); the MLP keeps the default. Every multiplier of the
config stays 1.0, so vLLM and transformers read the same numbers from the weights alone.
``hybridmem model sensitivity`` measures the effect (README, "Embedded tiny model").

``build_tiny_model(out, seed)`` is deterministic: the same seed gives the same bytes in every file
(weights via ``torch.manual_seed`` and a seeded ``torch.Generator``; the tokenizer is a fixed word
list). ``hybridmem.json`` beside ``config.json`` records the build version and the grid.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

MODEL_VERSION = 2  # bump when the builder's output changes, so stale builds are not reused
DEFAULT_DIR = Path(f"data/models/tiny-falcon-h1-v{MODEL_VERSION}")
TINY_GRID_TOKENS = 64  # organization grid of this model (attention block = checkpoint interval)
DEFAULT_SEED = 0
VOCAB_SIZE = 512
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MAX_MODEL_LEN = 2048
_FILES = ("config.json", "generation_config.json", "hybridmem.json", "model.safetensors",
          "tokenizer.json", "tokenizer_config.json")
META_NAME = "hybridmem.json"
# Weight shaping (see the module docstring): dt and decay ranges over the Mamba heads, and scales.
DT_RANGE = (0.01, 0.1)
DECAY_RANGE = (1e-3, 0.1)  # |A|
CONV_NOISE = 0.3
SSM_OUT_GAIN = 0.3
DT_PROJ_GAIN = 0.1
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
        mamba_d_ssm=320,
        mamba_n_heads=20,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=64,
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


def _log_spaced(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / max(1, n - 1)) for i in range(n)]


def _shape_weights(model: Any, seed: int) -> None:
    """Overwrite the weights that decide whether the recurrent state matters (module docstring).

    Draws come from ``torch.Generator().manual_seed(seed)`` in a fixed order, so the bytes depend on
    the seed only. Decay and dt are deterministic functions of the head index.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size, var: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * math.sqrt(var)

    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            mx = layer.mamba
            heads, d_ssm = mx.num_heads, mx.intermediate_size
            xbc = 2 * d_ssm + 2 * mx.n_groups * mx.ssm_state_size  # rows of z, x, B, C
            dt = torch.tensor(_log_spaced(*DT_RANGE, heads))
            mx.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
            mx.A_log.copy_(torch.log(torch.tensor(_log_spaced(*DECAY_RANGE, heads))))
            mx.D.zero_()
            w = mx.in_proj.weight
            w[:xbc] = normal(w[:xbc].shape, 1.0 / hidden)
            w[xbc:] = normal(w[xbc:].shape, DT_PROJ_GAIN**2 / hidden)
            conv = mx.conv1d.weight  # (conv_dim, 1, d_conv); the last tap sees the newest token
            conv.copy_(normal(conv.shape, CONV_NOISE**2))
            conv[:, 0, -1] += 1.0
            mx.out_proj.weight.copy_(normal(mx.out_proj.weight.shape, SSM_OUT_GAIN**2 / d_ssm))
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                proj.weight.copy_(normal(proj.weight.shape, 1.0 / proj.weight.shape[1]))
        model.lm_head.weight.copy_(normal(model.lm_head.weight.shape, 1.0 / hidden))


def _meta(seed: int) -> dict[str, object]:
    return {"format": "hybridmem-model", "version": MODEL_VERSION, "seed": seed,
            "grid_tokens": TINY_GRID_TOKENS}


def grid_tokens(model: Path | str) -> int | None:
    """The organization grid a model directory declares in ``hybridmem.json`` (``None``: none)."""
    path = Path(model) / META_NAME
    if not path.exists():
        return None
    try:
        grid = json.loads(path.read_text())["grid_tokens"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{str(path)!r}: no readable grid_tokens ({type(exc).__name__}: {exc})"
                         ) from None
    if not isinstance(grid, int) or grid < 16 or grid % 16:
        raise ValueError(f"{str(path)!r}: grid_tokens must be a positive multiple of 16, "
                         f"got {grid!r}")
    return grid


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
        if (meta.get("seed") == seed and meta.get("version") == MODEL_VERSION
                and meta.get("digest") == _digest(out)):
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
        _shape_weights(model, seed)
        model.save_pretrained(tmp, safe_serialization=True)
        gen = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        gen.save_pretrained(tmp)
        _build_tokenizer(tmp)
        (tmp / META_NAME).write_text(json.dumps(_meta(seed), indent=2, sort_keys=True) + "\n")
        digest = _digest(tmp)
        _stamp(tmp).write_text(json.dumps(
            {"seed": seed, "version": MODEL_VERSION, "digest": digest}) + "\n")
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
