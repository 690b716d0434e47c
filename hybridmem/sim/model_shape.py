"""What the cost model needs of a model: parameter counts, layer mix, state sizes.

The shape comes from the same ``config.json`` as the state geometry (:mod:`hybridmem.geometry`),
read as a plain dict, so any Falcon-H1 / Granite-4-H / Nemotron-H / Bamba config works::

    attention layer   W_q + W_k + W_v + W_o   = h (H_q d) + 2 h (H_kv d) + (H_q d) h
    Mamba2 layer      in_proj + out_proj      = h (2 d_ssm + 2 G N + H_m) + d_ssm h
                      + conv (conv_dim x d_conv) + per-head A, D, dt bias
    MLP layer         gated: 3 h I            plain (Nemotron-H '-'): 2 h I
    MoE (Granite)     router h E + E experts of 3 h I_e (k of them active per token)
    embeddings        V h (and an untied lm_head of V h)

``active_params`` (the weights one token multiplies) drives FLOPs; ``weight_bytes`` (every
weight, read once per step) drives the memory term. Presets resolve to the configs shipped in
``hybridmem/sim/configs`` (see SOURCES.md there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridmem.errors import ConfigError
from hybridmem.geometry import PRESETS, SHIPPED, Geometry, dtype_bytes, geometry_from_config
from hybridmem.inputs import read_input_text


@dataclass(frozen=True)
class ModelShape:
    name: str
    config_dir: Path            # a directory holding config.json (what vLLM's EngineArgs reads)
    geometry: Geometry
    hidden: int
    vocab: int
    attention_layers: int
    mamba_layers: int
    q_heads: int
    active_params: int          # non-embedding weights one token multiplies (+ lm_head)
    total_params: int           # every weight, embeddings included
    chunk_size: int             # Mamba2 SSD chunk length (prefill scan)

    @property
    def weight_bytes(self) -> int:
        return self.total_params * dtype_bytes(self.geometry.dtype)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "config_dir": str(self.config_dir), "hidden": self.hidden,
                "vocab": self.vocab, "attention_layers": self.attention_layers,
                "mamba_layers": self.mamba_layers, "active_params": self.active_params,
                "total_params": self.total_params, "weight_bytes": self.weight_bytes}


def _mlp(cfg: dict[str, Any], layers: int, hidden: int) -> tuple[int, int]:
    """(active, total) MLP/MoE parameters over all layers."""
    mtype = cfg.get("model_type")
    inter = int(cfg.get("intermediate_size") or 0)
    if mtype == "nemotron_h":
        pattern = str(cfg.get("hybrid_override_pattern") or "")
        n = pattern.count("-")
        p = n * 2 * hidden * inter
        return p, p
    shared = cfg.get("shared_intermediate_size")
    experts = int(cfg.get("num_local_experts") or 0)
    if mtype == "granitemoehybrid":
        width = int(shared if shared is not None else inter)
        dense = layers * 3 * hidden * width
        if experts > 0:
            k = int(cfg.get("num_experts_per_tok") or 1)
            per = 3 * hidden * inter
            router = layers * hidden * experts
            return dense + router + layers * k * per, dense + router + layers * experts * per
        return dense, dense
    p = layers * 3 * hidden * inter
    return p, p


def shape_from_config(cfg: dict[str, Any], config_dir: Path, name: str) -> ModelShape:
    geo = geometry_from_config(cfg, name=name)
    if name in PRESETS:
        geo = PRESETS[name]
    hidden = int(cfg.get("hidden_size") or 0)
    vocab = int(cfg.get("vocab_size") or 0)
    if hidden <= 0 or vocab <= 0:
        raise ConfigError(f"{name}: config needs a positive hidden_size and vocab_size")
    layers = geo.layers
    n_attn = geo.attention_layers if geo.attention_layers is not None else layers
    n_mamba = geo.mamba_layers if geo.mamba_layers is not None else layers
    q_heads = int(cfg.get("num_attention_heads") or geo.kv_heads)
    d = geo.head_dim
    attn = hidden * q_heads * d + 2 * hidden * geo.kv_heads * d + q_heads * d * hidden
    in_proj = hidden * (2 * geo.d_ssm + 2 * geo.n_groups * geo.d_state + geo.mamba_heads)
    mamba = in_proj + geo.d_ssm * hidden + geo.conv_dim * geo.d_conv + 3 * geo.mamba_heads
    mlp_active, mlp_total = _mlp(cfg, layers, hidden)
    emb = vocab * hidden
    lm_head = 0 if cfg.get("tie_word_embeddings") else emb
    body_active = n_attn * attn + n_mamba * mamba + mlp_active
    body_total = n_attn * attn + n_mamba * mamba + mlp_total
    return ModelShape(
        name=name, config_dir=config_dir, geometry=geo, hidden=hidden, vocab=vocab,
        attention_layers=n_attn, mamba_layers=n_mamba, q_heads=q_heads,
        active_params=body_active + vocab * hidden, total_params=body_total + emb + lm_head,
        chunk_size=int(cfg.get("mamba_chunk_size") or cfg.get("chunk_size") or 256),
    )


def load_shape(model: str) -> ModelShape:
    """A shipped name (:data:`hybridmem.geometry.SHIPPED`), a config.json, or a directory."""
    if model in SHIPPED:
        config_dir, name = SHIPPED[model], model
    else:
        path = Path(model)
        config_dir = path if path.is_dir() else path.parent
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"unknown model {model!r}: not a preset ({', '.join(SHIPPED)}) "
                              "and no such config.json or model directory")
        if path.name != "config.json":
            raise ConfigError(f"model {model!r}: the file must be named config.json (vLLM reads "
                              "a directory holding one)")
        name = str(model)
    try:
        cfg = json.loads(read_input_text(config_dir / "config.json", "config"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = str(config_dir / "config.json")
        raise ConfigError(f"cannot read config {where!r}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{model!r}: config.json is not a JSON object")
    if cfg.get("text_config") and isinstance(cfg["text_config"], dict):
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"}}
    return shape_from_config(cfg, config_dir, name)
