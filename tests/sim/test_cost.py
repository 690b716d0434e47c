"""Cost model, device presets, shipped configs and calibration (no vLLM needed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hybridmem.errors import HybridMemError
from hybridmem.geometry import PRESETS, geometry_from_config
from hybridmem.sim.calibrate import fit
from hybridmem.sim.cost import CostConstants, CostModel, Seq, StepFeatures
from hybridmem.sim.devices import DEVICES, get_device
from hybridmem.sim.model_shape import SHIPPED, load_shape


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_config_gives_the_preset_geometry(name: str) -> None:
    cfg = json.loads((SHIPPED[name] / "config.json").read_text())
    got = geometry_from_config(cfg, name=name).as_dict()
    want = PRESETS[name].as_dict()
    for key in ("attn_bytes_per_token", "ssm_bytes", "conv_bytes", "composite_bytes", "layers",
                "attention_layers", "mamba_layers"):
        assert got[key] == want[key], key
    # negative control: one changed width changes the geometry
    key = "mamba_d_state" if "mamba_d_state" in cfg else "ssm_state_size"
    cfg[key] = cfg[key] // 2
    assert geometry_from_config(cfg, name=name).ssm_bytes != want["ssm_bytes"]


def test_falcon_parameter_count_matches_the_card() -> None:
    shape = load_shape("falcon-h1-7b")
    assert 7.5e9 < shape.total_params < 7.7e9  # the card: 7.59 B
    assert shape.weight_bytes == 2 * shape.total_params


def test_device_presets_and_unknown_device() -> None:
    a100 = get_device("a100-40gb")
    assert (a100.peak_bf16_flops, a100.hbm_bytes_per_s) == (312e12, 1555e9)
    assert DEVICES["h200"].hbm_bytes_per_s > DEVICES["h100-80gb"].hbm_bytes_per_s
    with pytest.raises(HybridMemError, match="unknown device"):
        get_device("v100")


def _model(org: str = "S2", device: str = "a100-40gb", **k: float) -> CostModel:
    return CostModel(load_shape("falcon-h1-7b"), get_device(device), org, 512,
                     CostConstants().with_values(**k))


def test_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    m = _model()
    pre = m.step([Seq(2048, 0)])
    assert pre.gemm_s == pytest.approx(2 * m.shape.active_params * 2048 / (312e12 * 0.55))
    dec = m.step([Seq(1, 3000)])
    assert dec.gemm_s == pytest.approx(m.shape.weight_bytes / (1555e9 * 0.75))
    # more decoding sequences share one weight read: per-token time falls
    many = m.step([Seq(1, 3000)] * 32)
    assert many.seconds / 32 < dec.seconds / 4


def test_faster_device_and_organization_access() -> None:
    seqs = [Seq(1, 4000)] * 40 + [Seq(512, 1024)]
    assert _model(device="h200").step(seqs).seconds < _model(device="a100-40gb").step(seqs).seconds
    s0, s1, s2 = (_model(o).step(seqs) for o in ("S0", "S1", "S2"))
    assert s0.recurrent_s < s1.recurrent_s < s2.recurrent_s  # member pages, then slot lines
    same = _model("S2", member_page_eff=1.0, slot_line_eff=1.0).step(seqs)
    assert same.recurrent_s == pytest.approx(s0.recurrent_s)


def test_checkpoints_counted_on_the_grid() -> None:
    m = _model()
    assert m.features([Seq(1024, 0)]).checkpoints == 2
    assert m.features([Seq(10, 505)]).checkpoints == 1
    assert m.features([Seq(1, 100)]).checkpoints == 0


def test_constants_are_checked() -> None:
    for bad in ({"mfu": 0.0}, {"bw_eff": 1.5}, {"step_overhead_s": -1.0}, {"nope": 1.0}):
        with pytest.raises(HybridMemError):
            CostConstants().with_values(**bad)


def _timings(model: CostModel, n: int, noise: float, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cols: dict[str, list[float]] = {k: [] for k in (*StepFeatures._fields, "seconds")}
    for _ in range(n):
        seqs = [Seq(1, int(rng.integers(100, 6000))) for _ in range(int(rng.integers(1, 60)))]
        if rng.random() < 0.4:
            seqs.append(Seq(int(rng.integers(16, 2048)), int(rng.integers(0, 3000))))
        f = model.features(seqs)
        for k, v in zip(StepFeatures._fields, f, strict=True):
            cols[k].append(v)
        cols["seconds"].append(model.time(f).seconds * (1 + noise * rng.standard_normal()))
    return {k: np.asarray(v, dtype=float) for k, v in cols.items()}


def test_calibration_recovers_known_constants() -> None:
    truth = _model("vllm", mfu=0.42, bw_eff=0.63, step_overhead_s=0.007,
                   per_seq_overhead_s=1e-4)
    cols = _timings(truth, 300, noise=0.01)
    got = fit(_model("vllm"), cols)
    assert got.constants.mfu == pytest.approx(0.42, rel=0.05)
    assert got.constants.bw_eff == pytest.approx(0.63, rel=0.05)
    assert got.constants.step_overhead_s == pytest.approx(0.007, rel=0.2)
    assert got.rmse_s < got.before_rmse_s / 5
    assert got.r2 > 0.99
    # negative control: timings from another device's model do not fit the defaults' numbers
    other = fit(_model("vllm"), _timings(_model("vllm", device="h200"), 300, 0.01))
    assert not math.isclose(other.constants.mfu, 0.42, rel_tol=0.05)
