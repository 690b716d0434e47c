"""Geometry and derived units: SPEC §1-2 numbers digit for digit."""

import json

import pytest

from hybridmem.errors import ConfigError, GeometryError
from hybridmem.geometry import PRESETS, geometry_from_config, load_geometry
from hybridmem.units import derive_units

# Falcon-H1-7B's public config fields (the ones geometry reads), as transformers writes them.
FALCON_H1_7B_CONFIG = {
    "model_type": "falcon_h1", "hidden_size": 3072, "num_hidden_layers": 44,
    "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128,
    "mamba_n_heads": 24, "mamba_d_head": 128, "mamba_d_ssm": 3072, "mamba_d_state": 256,
    "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "torch_dtype": "bfloat16",
}


def test_falcon_preset_matches_spec_table():
    g = PRESETS["falcon-h1-7b"]
    assert g.attn_bytes_per_token == 1_024
    assert g.ssm_bytes == 1_572_864
    assert g.conv_dim == 3_584
    assert g.conv_bytes == 21_504
    assert g.composite_bytes == 1_594_368
    assert g.layers == 44


def test_falcon_units_match_spec_section_2():
    u = derive_units(PRESETS["falcon-h1-7b"])
    assert (u.page_bytes, u.ssm_members, u.conv_slot_bytes, u.slots_per_slab) == (
        524_288, 3, 32_768, 16)
    assert u.s0_page_bytes == 1_594_368  # 1,557 KiB
    assert u.uniform_tokens == 1_568
    assert u.label_unit_bytes == 1_605_632
    assert (u.d0_attn_tokens, u.d0_attn_unit_bytes) == (16, 16_384)
    assert u.d0_recurrent_unit_bytes == 1_594_368
    assert u.d0_interval_tokens == 1_792
    assert u.s1_checkpoint_bytes == 2_048 * 1024


def test_granite_pages_match_appendix_b3():
    u = derive_units(PRESETS["granite-4.0-h-micro"])
    assert u.d0_attn_unit_bytes == 32_768
    assert u.d0_recurrent_unit_bytes == 1_074_688
    assert PRESETS["granite-4.0-h-micro"].attention_fraction == 0.199699


def test_config_dict_gives_same_geometry_as_preset(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(FALCON_H1_7B_CONFIG))
    for spec in (str(tmp_path), str(tmp_path / "config.json")):
        g = load_geometry(spec)
        p = PRESETS["falcon-h1-7b"]
        assert (g.attn_bytes_per_token, g.ssm_bytes, g.conv_bytes, g.layers) == (
            p.attn_bytes_per_token, p.ssm_bytes, p.conv_bytes, p.layers)
        assert (g.attention_layers, g.mamba_layers) == (44, 44)
        assert g.attention_fraction is None  # a per-model preset, never guessed


def test_ssm_dtype_apart_from_model_dtype():
    g = load_geometry("falcon-h1-7b", ssm_dtype="float32")
    assert g.ssm_bytes == 2 * 1_572_864
    assert g.conv_bytes == 21_504  # conv state keeps the model dtype
    assert g.attn_bytes_per_token == 1_024


def test_nemotron_and_granite_field_names():
    nemotron = {"model_type": "nemotron_h", "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "mamba_num_heads": 8,
                "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
                "hybrid_override_pattern": "M*M-", "torch_dtype": "bfloat16"}
    g = geometry_from_config(nemotron)
    assert g.ssm_bytes == 8 * 16 * 16 * 2
    assert g.conv_bytes == 3 * (128 + 2 * 2 * 16) * 2
    assert (g.attention_layers, g.mamba_layers) == (1, 2)
    granite = {"model_type": "granitemoehybrid", "num_hidden_layers": 3, "hidden_size": 256,
               "num_attention_heads": 4, "num_key_value_heads": 1, "mamba_n_heads": 8,
               "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4,
               "layer_types": ["mamba", "attention", "mamba"]}
    g = geometry_from_config(granite)
    assert g.head_dim == 64 and g.attn_bytes_per_token == 2 * 1 * 64 * 2
    assert (g.attention_layers, g.mamba_layers) == (1, 2)


def test_non_hybrid_config_names_the_problem():
    with pytest.raises(ConfigError, match="not a Mamba2-style hybrid.*llama"):
        geometry_from_config({"model_type": "llama", "num_hidden_layers": 2})


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="'nope'.*falcon-h1-7b"):
        load_geometry("nope")


def test_slot_that_does_not_divide_page_is_an_error():
    # a = 32 B/token: page 16 KiB < conv slot 32 KiB.
    cfg = {**FALCON_H1_7B_CONFIG, "num_key_value_heads": 1, "head_dim": 8}
    with pytest.raises(GeometryError, match="does not divide"):
        derive_units(geometry_from_config(cfg))


def test_transformers_normalised_layer_types_count_as_mamba_and_attention():
    # transformers 5 turns Granite-4-H's "mamba"/"attention" into these names
    from hybridmem.geometry import _layer_counts

    types = ["linear_attention"] * 9 + ["full_attention"]
    assert _layer_counts({"layer_types": types}, 10) == (1, 9, 10)
    assert _layer_counts({"layer_types": ["mamba"] * 3 + ["attention"]}, 4) == (1, 3, 4)
