"""Whole-model accounting of three hybrid families, computed by hand from each shipped config.

    falcon-h1-7b         parallel: every one of 44 layers holds attention KV and Mamba state
    granite-4.0-h-micro  sequential: layer_types names 4 attention + 36 Mamba layers
    nemotron-h-8b        sequential: hybrid_override_pattern "M-M-...*..." 4 '*' + 24 'M' + 24 '-'

The hand computation below reads the config's own fields and its layer list with plain counting,
not through hybridmem.geometry, then checks the planner's and the storage model's whole-model bytes.
"""

import json
from dataclasses import replace

import pytest

from hybridmem.budget import BudgetError, parse_budget, parse_total, plan_budget
from hybridmem.cli.main import main
from hybridmem.geometry import PRESETS, SHIPPED, geometry_from_config
from hybridmem.storage_cost import model_bytes
from hybridmem.units import derive_units

FAMILIES = ("falcon-h1-7b", "granite-4.0-h-micro", "nemotron-h-8b")


def _config(name: str) -> dict:
    return json.loads((SHIPPED[name] / "config.json").read_text())


def _by_hand(cfg: dict) -> dict[str, int]:
    """a, r and the attention / Mamba / any-state layer counts, from the config's fields."""
    g = lambda *keys: next(cfg[k] for k in keys if k in cfg)  # noqa: E731
    heads, hdim = g("mamba_n_heads", "mamba_num_heads"), g("mamba_d_head", "mamba_head_dim")
    d_state, groups = g("mamba_d_state", "ssm_state_size"), g("mamba_n_groups", "n_groups")
    d_conv = g("mamba_d_conv", "conv_kernel")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    a = 2 * cfg["num_key_value_heads"] * head_dim * 2  # bf16
    r = heads * hdim * d_state * 2 + (d_conv - 1) * (heads * hdim + 2 * groups * d_state) * 2
    n = cfg["num_hidden_layers"]
    if "hybrid_override_pattern" in cfg:
        p = cfg["hybrid_override_pattern"]
        attn, mamba = p.count("*"), p.count("M")
        state = attn + mamba
    elif "layer_types" in cfg:
        attn = cfg["layer_types"].count("attention")
        mamba = cfg["layer_types"].count("mamba")
        state = attn + mamba
    else:  # Falcon-H1: both mixers in every layer
        attn = mamba = state = n
    return {"a": a, "r": r, "layers": n, "attn": attn, "mamba": mamba, "state": state}


EXPECTED_LAYERS = {"falcon-h1-7b": (44, 44, 44, 44), "granite-4.0-h-micro": (40, 4, 36, 40),
                   "nemotron-h-8b": (52, 4, 24, 28)}


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_counts_by_hand(name):
    h = _by_hand(_config(name))
    assert (h["layers"], h["attn"], h["mamba"], h["state"]) == EXPECTED_LAYERS[name]
    geo = geometry_from_config(_config(name), name)
    assert (geo.layers, geo.n_attention_layers, geo.n_mamba_layers, geo.n_state_layers) == \
        EXPECTED_LAYERS[name]
    assert (geo.attn_bytes_per_token, geo.composite_bytes) == (h["a"], h["r"])


@pytest.mark.parametrize("name", FAMILIES)
def test_plan_whole_model_bytes_by_hand(name):
    h = _by_hand(_config(name))
    geo = PRESETS[name]
    if geo.attention_fraction is None:
        geo = geo.with_attention_fraction(0.25)
    u = derive_units(geo)
    plan = plan_budget(u, parse_budget("b63", u))
    d = plan.as_dict()["orgs"]
    for org in ("S0", "S1", "S2"):
        assert d[org]["model_bytes"] == d[org]["bytes"] * h["state"], org
    d0 = plan.d0
    assert d["D0"]["model_bytes"] == (d0.attention_bytes * h["attn"]
                                      + d0.recurrent_bytes * h["mamba"])
    if name != "falcon-h1-7b":
        # negative control: the old accounting (every kind on every layer) differs
        assert d["D0"]["model_bytes"] != d0.bytes * h["layers"]
        assert d["S1"]["model_bytes"] != d["S1"]["bytes"] * h["layers"] or h["state"] == \
            h["layers"]


@pytest.mark.parametrize("name", FAMILIES)
def test_storage_whole_model_bytes_by_hand(name):
    h = _by_hand(_config(name))
    u = derive_units(PRESETS[name])
    xa, xr = 10, 3
    page, a16 = 512 * h["a"], 512 // 16
    m = -(-xr // u.slots_per_slab)
    want = {
        "S0": u.s0_page_bytes * (xa * h["attn"] + xr * h["mamba"]),
        "S1": page * xa * h["attn"] + u.s1_checkpoint_bytes * xr * h["mamba"],
        "S2": page * xa * h["attn"]
        + (u.s2_checkpoint_bytes_without_slab * xr + page * m) * h["mamba"],
        "D0": 16 * h["a"] * a16 * xa * h["attn"] + h["r"] * xr * h["mamba"],
    }
    for org, value in want.items():
        assert model_bytes(org, u, xa, xr) == value, org


def test_falcon_per_layer_and_whole_model_unchanged():
    u = derive_units(PRESETS["falcon-h1-7b"])
    plan = plan_budget(u, parse_budget("b63", u))
    assert (plan.s0.bytes, plan.s1.bytes, plan.d0.bytes) == (100_445_184, 101_187_584, 99_582_976)
    assert plan.model_bytes("S0") == 100_445_184 * 44
    assert plan.model_bytes("D0") == 99_582_976 * 44


def test_nemotron_pattern_change_changes_the_count():
    # negative control for the pattern reader: one Mamba layer turned MLP-only
    cfg = _config("nemotron-h-8b")
    cfg["hybrid_override_pattern"] = "-" + cfg["hybrid_override_pattern"][1:]
    geo = geometry_from_config(cfg, "x")
    assert (geo.n_mamba_layers, geo.n_state_layers) == (23, 27)


@pytest.mark.parametrize("name", FAMILIES)
def test_total_never_exceeds_and_falcon_matches_labels(name):
    geo = PRESETS[name]
    if geo.attention_fraction is None:
        geo = geo.with_attention_fraction(0.25)
    u = derive_units(geo)
    total = 8 * 2**30
    plan = plan_budget(u, parse_total("8GiB", u))
    for org in ("S0", "S1", "S2", "D0"):
        assert plan.model_bytes(org) <= total, org
        # one more unit of the org's page would overshoot (the split rounds down, never away)
    page = u.page_bytes * u.geometry.n_state_layers
    assert plan.model_bytes("S1") + page > total
    if name == "falcon-h1-7b":  # parallel: a total of 44 x b63 is b63 per layer for D0 and S0
        t = 44 * 101_154_816
        p = plan_budget(u, parse_total(str(t), u))
        b = plan_budget(u, parse_budget("b63", u))
        assert (p.d0, p.s0) == (b.d0, b.s0)
        assert p.s1.pages == 192 and b.s1.pages == 193  # floor versus the label's round-half-up


def test_too_small_budgets_are_refused():
    u = derive_units(PRESETS["falcon-h1-7b"])
    with pytest.raises(BudgetError, match="did you mean b63"):
        parse_budget("63", u)
    with pytest.raises(BudgetError, match="D0 0 recurrent composites"):
        plan_budget(u, parse_budget("b1", u)).check_holds()
    plan_budget(u, parse_budget("b3", u)).check_holds()  # control: b3 holds a composite
    nofrac = derive_units(replace(PRESETS["falcon-h1-7b"], attention_fraction=None))
    plan_budget(nofrac, parse_budget("b1", nofrac)).check_holds()  # no D0 planned: S0-S2 hold


def test_cli_forgotten_b_and_small_total(capsys):
    assert main(["plan", "--model", "falcon-h1-7b", "--budget", "63"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean b63?" in err
    assert main(["plan", "--model", "falcon-h1-7b", "--total", "10MiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1,594,368 B" in err and "10,485,760" in err
    assert main(["plan", "--model", "falcon-h1-7b", "--budget", "b63"]) == 0  # control
    out = capsys.readouterr().out
    assert "S0 whole-model bytes" in out and "x 44" in out


def test_cli_sequential_whole_model(capsys):
    assert main(["plan", "--model", "nemotron-h-8b", "--budget", "b63",
                 "--attention-fraction", "0.2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["attention_layers"], d["mamba_layers"], d["state_layers"]) == (4, 24, 28)
    assert d["orgs"]["S1"]["model_bytes"] == d["orgs"]["S1"]["bytes"] * 28


def test_other_layouts_the_reader_accepts():
    from hybridmem.errors import ConfigError
    from hybridmem.geometry import _layer_counts

    # Zamba2: "hybrid" layers hold a Mamba mixer and the shared attention block
    assert _layer_counts({"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]}, 4) == (
        2, 4, 4)
    # Bamba: attn_layer_indices; every other layer is a Mamba layer
    assert _layer_counts({"attn_layer_indices": [1, 3]}, 6) == (2, 4, 6)
    # transformers 5 Nemotron-H names; MLP/MoE layers hold no state
    assert _layer_counts({"layer_types": ["linear_attention", "mlp", "full_attention", "moe"]},
                         4) == (1, 1, 2)
    # a layer kind the pattern does not define is refused, never guessed
    with pytest.raises(ConfigError, match="unknown layer kinds"):
        _layer_counts({"hybrid_override_pattern": "M*X"}, 3)
    # no layer list and not Falcon-H1: unknown, counted as parallel (said in `layout`)
    assert _layer_counts({}, 4) == (None, None, None)
    geo = replace(PRESETS["falcon-h1-7b"], attention_layers=None, mamba_layers=None)
    assert geo.n_state_layers == 44 and geo.layout.startswith("assumed parallel")
