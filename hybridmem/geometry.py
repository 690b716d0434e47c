"""Per-layer state geometry of a hybrid attention-SSM model, derived from its config.

Everything downstream (units, storage cost, budgets, allocators) starts from four numbers per layer:

    a = attention KV bytes per token   = 2 (K,V) x kv_heads x head_dim x dtype_bytes
    s = SSM state bytes                = mamba_heads x mamba_head_dim x d_state x ssm_dtype_bytes
    c = conv state bytes               = (d_conv - 1) x conv_dim x dtype_bytes,
                                         conv_dim = d_ssm + 2 x n_groups x d_state
    r = recurrent composite bytes      = s + c

Falcon-H1-7B in bf16: a = 1,024, s = 1,572,864, c = 21,504, r = 1,594,368, 44 layers.

Which layers hold which state is the other half of a model's accounting. A parallel hybrid
(Falcon-H1) has an attention and a Mamba mixer in every layer; a sequential hybrid gives each
layer one mixer (Granite-4.0-H: 4 attention + 36 Mamba of 40; Nemotron-H-8B: 4 attention + 24
Mamba + 24 MLP-only of 52). Whole-model bytes count attention KV on attention layers and recurrent
(SSM + conv) state on Mamba layers: :attr:`Geometry.n_attention_layers`,
:attr:`Geometry.n_mamba_layers`, :attr:`Geometry.n_state_layers` (layers holding any state).

Configs are read as plain dicts (a ``config.json`` or a model directory holding one), so neither
transformers nor vLLM is needed here. Field names of several Mamba2-style hybrid families are
accepted (Falcon-H1, Bamba, GraniteMoeHybrid, NemotronH, Zamba2); see ``_ALIASES``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hybridmem.errors import ConfigError
from hybridmem.inputs import read_input_text

# Architecture-only configs shipped with the package (no weights), by model name; SOURCES.md there
# cites every number. One registry: `plan`, `storage`, `sim` and the engine commands resolve
# these names here (the engine commands refuse them: there are no weights to serve).
CONFIG_DIR = Path(__file__).with_name("sim") / "configs"
SHIPPED: dict[str, Path] = {
    name: CONFIG_DIR / name for name in ("falcon-h1-7b", "granite-4.0-h-micro", "nemotron-h-8b")
}

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "fp8": 1,
}


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name such as ``bfloat16`` or ``torch.float32``."""
    key = str(name).removeprefix("torch.").lower()
    if key not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {name!r}; expected one of {sorted(set(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


# D0's attention share: a split outside this range leaves one of its two pools a handful of
# bytes (no unit fits in any budget a layer can have), so it is refused where it is read
ATTENTION_FRACTION_RANGE = (1e-3, 1.0 - 1e-3)

@dataclass(frozen=True)
class Geometry:
    """Per-layer state sizes of one model. All byte counts are per layer.

    ``attention_fraction`` is D0's calibrated attention share (App. B.3, Table B-3); it is a
    per-model preset and ``None`` when unknown (D0 planning then needs it given explicitly).
    """

    model: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    mamba_heads: int
    mamba_head_dim: int
    d_state: int
    n_groups: int
    d_conv: int
    ssm_dtype: str
    attention_layers: int | None = None  # None: the config does not say (counted as parallel)
    mamba_layers: int | None = None
    attention_fraction: float | None = None
    state_layers: int | None = None  # layers holding any state; None: derived from the two above

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "mamba_heads", "mamba_head_dim",
                     "d_state", "n_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{self.model}: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.d_conv, int) or self.d_conv < 2:
            raise ConfigError(f"{self.model}: d_conv must be an integer >= 2, got {self.d_conv!r}")
        dtype_bytes(self.dtype)
        dtype_bytes(self.ssm_dtype)
        if self.attention_fraction is not None and not 0.0 < self.attention_fraction < 1.0:
            raise ConfigError(
                f"{self.model}: attention fraction must lie in (0, 1), "
                f"got {self.attention_fraction}"
            )

    # -- layer counts of the whole model ------------------------------------------------------
    @property
    def n_attention_layers(self) -> int:
        """Layers holding attention KV (every layer when the config does not say)."""
        return self.layers if self.attention_layers is None else self.attention_layers

    @property
    def n_mamba_layers(self) -> int:
        """Layers holding recurrent (SSM + conv) state (every layer when not said)."""
        return self.layers if self.mamba_layers is None else self.mamba_layers

    @property
    def n_state_layers(self) -> int:
        """Layers holding any state: a parallel hybrid's every layer, a sequential hybrid's
        attention plus Mamba layers (MLP-only layers hold none)."""
        if self.state_layers is not None:
            return self.state_layers
        return min(self.layers, self.n_attention_layers + self.n_mamba_layers)

    @property
    def layout(self) -> str:
        """``parallel``, ``sequential`` or ``mixed``, and ``assumed parallel`` when unknown."""
        if self.attention_layers is None or self.mamba_layers is None:
            return "assumed parallel (the config names no layer types)"
        a, m, n = self.attention_layers, self.mamba_layers, self.n_state_layers
        if a == m == n:
            return "parallel"
        return "sequential" if a + m == n else "mixed"

    # -- derived per-layer byte counts -------------------------------------------------------
    @property
    def d_ssm(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_ssm + 2 * self.n_groups * self.d_state

    @property
    def attn_bytes_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * dtype_bytes(self.dtype)

    @property
    def ssm_bytes(self) -> int:
        return self.d_ssm * self.d_state * dtype_bytes(self.ssm_dtype)

    @property
    def conv_bytes(self) -> int:
        return (self.d_conv - 1) * self.conv_dim * dtype_bytes(self.dtype)

    @property
    def composite_bytes(self) -> int:
        return self.ssm_bytes + self.conv_bytes

    def with_ssm_dtype(self, ssm_dtype: str) -> Geometry:
        """The same model with the SSM state kept in another dtype (e.g. fp32 state)."""
        return replace(self, ssm_dtype=ssm_dtype)

    def with_attention_fraction(self, fraction: float) -> Geometry:
        return replace(self, attention_fraction=fraction)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "layers": self.layers,
            "attention_layers": self.attention_layers,
            "mamba_layers": self.mamba_layers,
            "state_layers": self.n_state_layers,
            "layout": self.layout,
            "dtype": self.dtype,
            "ssm_dtype": self.ssm_dtype,
            "attn_bytes_per_token": self.attn_bytes_per_token,
            "ssm_bytes": self.ssm_bytes,
            "conv_bytes": self.conv_bytes,
            "composite_bytes": self.composite_bytes,
            "d_ssm": self.d_ssm,
            "conv_dim": self.conv_dim,
            "d_state": self.d_state,
            "n_groups": self.n_groups,
            "d_conv": self.d_conv,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "attention_fraction": self.attention_fraction,
        }


# -- presets -------------------------------------------------------------------------------
# Falcon-H1-7B: SPEC §1. Granite: GraniteMoeHybrid 4.0-H geometry whose pages reproduce App. B.3
# (attention page 32,768 B per 16 tokens, recurrent page 1,074,688 B, attention fraction 0.199699).
PRESETS: dict[str, Geometry] = {
    "falcon-h1-7b": Geometry(
        model="falcon-h1-7b", layers=44, kv_heads=2, head_dim=128, dtype="bfloat16",
        mamba_heads=24, mamba_head_dim=128, d_state=256, n_groups=1, d_conv=4,
        ssm_dtype="bfloat16", attention_layers=44, mamba_layers=44,
        attention_fraction=0.527383,
    ),
    "granite-4.0-h-micro": Geometry(
        model="granite-4.0-h-micro", layers=40, kv_heads=4, head_dim=128, dtype="bfloat16",
        mamba_heads=64, mamba_head_dim=64, d_state=128, n_groups=1, d_conv=4,
        ssm_dtype="bfloat16", attention_layers=4, mamba_layers=36,
        attention_fraction=0.199699,
    ),
    # Nemotron-H-8B (SOURCES.md): no calibrated D0 fraction, so D0 planning needs one given.
    "nemotron-h-8b": Geometry(
        model="nemotron-h-8b", layers=52, kv_heads=8, head_dim=128, dtype="bfloat16",
        mamba_heads=128, mamba_head_dim=64, d_state=128, n_groups=8, d_conv=4,
        ssm_dtype="bfloat16", attention_layers=4, mamba_layers=24, state_layers=28,
    ),
}

# Accepted config field names, first match wins.
_ALIASES: dict[str, tuple[str, ...]] = {
    "mamba_heads": ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads"),
    "mamba_head_dim": ("mamba_d_head", "mamba_head_dim"),
    "d_ssm": ("mamba_d_ssm",),
    "d_state": ("mamba_d_state", "ssm_state_size", "mamba_state_size"),
    "n_groups": ("mamba_n_groups", "n_groups", "mamba_ngroups"),
    "d_conv": ("mamba_d_conv", "conv_kernel", "mamba_conv_kernel"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "dtype": ("dtype", "torch_dtype"),
}


def _first(cfg: dict[str, Any], field: str) -> Any:
    for key in _ALIASES[field]:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def _layer_kinds(kind: str) -> tuple[bool, bool]:
    """(holds attention KV, holds recurrent state) of one entry of a layer-type list."""
    k = kind.lower()
    if k == "hybrid":  # Zamba2: a Mamba layer with the shared attention block
        return True, True
    # transformers 5 normalises some hybrids' names: Granite-4-H's "mamba" layers read
    # "linear_attention" and its attention layers "full_attention"
    mamba = "mamba" in k or k in ("linear_attention", "ssm")
    return "attention" in k and not mamba, mamba


# hybrid_override_pattern (Nemotron-H): M Mamba2, * attention, - MLP, E MoE (the last two hold
# no state)
_PATTERN_KINDS = {"M": (False, True), "*": (True, False), "-": (False, False),
                  "E": (False, False)}


def _layer_counts(cfg: dict[str, Any], layers: int, name: str = "config"
                  ) -> tuple[int | None, int | None, int | None]:
    """(attention, Mamba, any-state) layer counts where the config says which layer is which."""
    kinds: list[tuple[bool, bool]] | None = None
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(types, list) and types:
        kinds = [_layer_kinds(str(t)) for t in types]
    elif isinstance(pattern, str) and pattern:
        bad = sorted(set(pattern) - set(_PATTERN_KINDS))
        if bad:
            raise ConfigError(f"{name}: hybrid_override_pattern has unknown layer kinds {bad} "
                              f"(known: {''.join(_PATTERN_KINDS)})")
        kinds = [_PATTERN_KINDS[c] for c in pattern]
    elif isinstance(cfg.get("attn_layer_indices"), list):  # Bamba: the rest are Mamba layers
        attn = {int(i) for i in cfg["attn_layer_indices"]}
        kinds = [(i in attn, i not in attn) for i in range(int(layers))]
    elif cfg.get("model_type") == "falcon_h1":  # parallel hybrid: every layer has both mixers
        return layers, layers, layers
    if kinds is None:
        return None, None, None
    return (sum(a for a, _ in kinds), sum(m for _, m in kinds),
            sum(a or m for a, m in kinds))


# Integer fields a config may give; each, when present, must be a whole number in
# [1, MAX_CONFIG_INT] (a zero head count, 2.5 layers, ``true`` or 10**40 cannot be priced).
_INT_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim",
               "attention_head_dim", "mamba_expand",
               *(k for f in ("mamba_heads", "mamba_head_dim", "d_ssm", "d_state", "n_groups",
                             "d_conv", "kv_heads") for k in _ALIASES[f]))
MAX_CONFIG_INT = 1 << 24


def _check_config_values(cfg: dict[str, Any], name: str) -> None:
    for key in _INT_FIELDS:
        v = cfg.get(key)
        if v is None:
            continue
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or v != int(v)):
            raise ConfigError(f"{name}: {key} must be a whole number, got {v!r:.60}")
        if not 1 <= v <= MAX_CONFIG_INT:
            raise ConfigError(f"{name}: {key} must lie in [1, {MAX_CONFIG_INT:,}], got {v!r:.60}")
    for key in _ALIASES["dtype"]:
        v = cfg.get(key)
        if v is not None:
            if not isinstance(v, str):
                raise ConfigError(f"{name}: {key} must be a dtype name, got {v!r:.60}")
            dtype_bytes(v)


def geometry_from_config(
    cfg: dict[str, Any], name: str = "config", ssm_dtype: str | None = None
) -> Geometry:
    """Derive a :class:`Geometry` from a Hugging Face config dict of a Mamba2-style hybrid.

    Raises :class:`ConfigError` naming the missing field when the config is not such a hybrid.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{name}: config must be a JSON object, got {type(cfg).__name__}")
    if cfg.get("text_config") and isinstance(cfg["text_config"], dict):
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"}}
    _check_config_values(cfg, name)
    if ssm_dtype is not None:
        dtype_bytes(ssm_dtype)
    heads = _first(cfg, "mamba_heads")
    d_state = _first(cfg, "d_state")
    if heads is None or d_state is None:
        raise ConfigError(
            f"{name}: not a Mamba2-style hybrid config (model_type={cfg.get('model_type')!r}): "
            f"no mamba head count ({'/'.join(_ALIASES['mamba_heads'])}) or state size "
            f"({'/'.join(_ALIASES['d_state'])})"
        )
    head_dim_m = _first(cfg, "mamba_head_dim")
    d_ssm = _first(cfg, "d_ssm")
    if head_dim_m is None:
        if d_ssm is None:
            expand = cfg.get("mamba_expand")
            hidden = cfg.get("hidden_size")
            if expand is None or hidden is None:
                raise ConfigError(f"{name}: cannot derive the mamba head dim (no mamba_d_head, "
                                  "mamba_d_ssm or mamba_expand x hidden_size)")
            d_ssm = int(expand * hidden)
        if d_ssm % heads:
            raise ConfigError(f"{name}: d_ssm {d_ssm} is not divisible by {heads} mamba heads")
        head_dim_m = d_ssm // heads
    elif d_ssm is not None and d_ssm != heads * head_dim_m:
        raise ConfigError(f"{name}: mamba_d_ssm {d_ssm} != mamba heads {heads} x head dim "
                          f"{head_dim_m}")
    n_heads = cfg.get("num_attention_heads")
    kv_heads = _first(cfg, "kv_heads") or n_heads
    head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim")
    if head_dim is None:
        hidden = cfg.get("hidden_size")
        if not hidden or not n_heads:
            raise ConfigError(f"{name}: no head_dim and no hidden_size/num_attention_heads")
        head_dim = hidden // n_heads
    if kv_heads is None:
        raise ConfigError(f"{name}: no num_key_value_heads or num_attention_heads")
    layers = cfg.get("num_hidden_layers")
    if not layers:
        raise ConfigError(f"{name}: no num_hidden_layers")
    dtype = str(_first(cfg, "dtype") or "bfloat16").removeprefix("torch.")
    n_groups = _first(cfg, "n_groups")
    d_conv = _first(cfg, "d_conv")
    for field, value in (("n_groups", n_groups), ("d_conv", d_conv)):
        if value is None:  # never a silent default: the conv state size depends on both
            raise ConfigError(f"{name}: no {field} ({'/'.join(_ALIASES[field])}); the conv "
                              "state cannot be priced without it")
    cache_dtype = cfg.get("mamba_ssm_cache_dtype")
    if ssm_dtype is None and isinstance(cache_dtype, str) and cache_dtype != "auto":
        dtype_bytes(cache_dtype)
        ssm_dtype = cache_dtype.removeprefix("torch.")  # the SSM state's own dtype
    attn_layers, mamba_layers, state_layers = _layer_counts(cfg, int(layers), name)
    for kind, count in (("attention", attn_layers), ("mamba", mamba_layers)):
        if count == 0:
            raise ConfigError(f"{name}: no {kind} layers (layer pattern of "
                              f"{int(layers)} layers); not a hybrid this tool can price")
    return Geometry(
        model=name, layers=int(layers), kv_heads=int(kv_heads), head_dim=int(head_dim),
        dtype=dtype, mamba_heads=int(heads), mamba_head_dim=int(head_dim_m),
        d_state=int(d_state), n_groups=int(n_groups), d_conv=int(d_conv),
        ssm_dtype=ssm_dtype or dtype, attention_layers=attn_layers, mamba_layers=mamba_layers,
        state_layers=state_layers,
    )


def load_geometry(model: str, ssm_dtype: str | None = None) -> Geometry:
    """A preset name, a ``config.json`` path, or a model directory holding ``config.json``."""
    if ssm_dtype is not None:
        dtype_bytes(ssm_dtype)  # "" or "float7" is refused, never silently ignored
    if model in PRESETS:
        geo = PRESETS[model]
        return geo.with_ssm_dtype(ssm_dtype) if ssm_dtype else geo
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ConfigError(
            f"unknown model {model!r}: not a preset ({', '.join(sorted(PRESETS))}) "
            "and no such config file or model directory"
        )
    try:
        cfg = json.loads(read_input_text(path, "config"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read config {str(path)!r}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"cannot read config {str(path)!r}: JSON nested too deeply") from None
    return geometry_from_config(cfg, name=str(model), ssm_dtype=ssm_dtype)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1
