"""Config reading prices only what the config states: a missing group or conv field
is refused by name, a model without attention (or without Mamba) layers is not a hybrid, and
``mamba_ssm_cache_dtype`` sets the SSM state's dtype."""

import pytest

from hybridmem.errors import ConfigError
from hybridmem.geometry import geometry_from_config

BASE = {"model_type": "granitemoehybrid", "num_hidden_layers": 3, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 1, "mamba_n_heads": 8,
        "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4,
        "layer_types": ["mamba", "attention", "mamba"], "torch_dtype": "bfloat16"}


def test_base_config_reads():  # negative control for the refusals below
    g = geometry_from_config(BASE)
    assert (g.n_groups, g.d_conv, g.ssm_dtype) == (1, 4, "bfloat16")


@pytest.mark.parametrize("field,names", [("mamba_n_groups", "n_groups"),
                                         ("mamba_d_conv", "d_conv")])
def test_missing_conv_fields_are_named(field, names):
    cfg = {k: v for k, v in BASE.items() if k != field}
    with pytest.raises(ConfigError, match=f"no {names} .*{field}"):
        geometry_from_config(cfg)


@pytest.mark.parametrize("types,kind", [(["attention"] * 3, "mamba"), (["mamba"] * 3, "attention")])
def test_all_one_kind_is_not_a_hybrid(types, kind):
    with pytest.raises(ConfigError, match=f"no {kind} layers"):
        geometry_from_config({**BASE, "layer_types": types})


def test_ssm_cache_dtype_is_read():
    g = geometry_from_config({**BASE, "mamba_ssm_cache_dtype": "float32"})
    assert g.ssm_dtype == "float32" and g.ssm_bytes == 2 * geometry_from_config(BASE).ssm_bytes
    assert geometry_from_config({**BASE, "mamba_ssm_cache_dtype": "auto"}).ssm_dtype == "bfloat16"
    # an explicit --ssm-dtype wins over the config
    assert geometry_from_config({**BASE, "mamba_ssm_cache_dtype": "float32"},
                                ssm_dtype="bfloat16").ssm_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="unknown dtype"):
        geometry_from_config({**BASE, "mamba_ssm_cache_dtype": "float7"})
