"""Trace probe-effect rule (SPEC §6): pairing by seed, the 90% interval, PASS/FAIL/exit codes."""

import json
import math

import pytest

from hybridmem.cli.main import main
from hybridmem.fidelity import FidelityError, fidelity, read_summary


def write_run(root, name, seed, trace, tok_s, ledger=None, **extra):
    d = root / name
    d.mkdir()
    data = {"seed": seed, "trace": trace, "throughput_tok_s": tok_s,
            "throughput_ledger_tok_s": tok_s if ledger is None else ledger, **extra}
    (d / "summary.json").write_text(json.dumps(data))
    return d


def runs(tmp_path, on_vals, off_vals, seeds=None, **kw):
    seeds = seeds or list(range(len(on_vals)))
    on = [write_run(tmp_path, f"on{s}", s, True, v, **kw) for s, v in zip(seeds, on_vals,
                                                                          strict=True)]
    off = [write_run(tmp_path, f"off{s}", s, False, v, **kw) for s, v in zip(seeds, off_vals,
                                                                             strict=True)]
    return on, off


def test_pass_interval_by_hand(tmp_path):
    # effects 100 ln(ON/OFF) = -1, 0, +1 log points: mean 0, sd 1, t(0.95, 2) = 2.919985580353726
    # half width 2.919985580353726 / sqrt(3) = 1.6858 -> [-1.6858, +1.6858] inside [-3, 3]: PASS
    off = [400.0, 410.0, 420.0]
    on = [400.0 * math.exp(-0.01), 410.0, 420.0 * math.exp(0.01)]
    r = fidelity(*runs(tmp_path, on, off))
    assert [round(p.effect, 12) for p in r.pairs] == [-1.0, 0.0, 1.0]
    assert r.interval.high == pytest.approx(2.919985580353726 / math.sqrt(3), rel=1e-12)
    assert r.interval.low == pytest.approx(-r.interval.high, rel=1e-12)
    assert r.passed


def test_fail_when_interval_crosses_bound(tmp_path):
    # effects -1, +2, +4.5: mean 1.8333, sd 2.7538, half width 4.6424 -> [-2.81, +6.48]: FAIL
    off = [100.0, 100.0, 100.0]
    on = [100 * math.exp(e / 100) for e in (-1.0, 2.0, 4.5)]
    r = fidelity(*runs(tmp_path, on, off))
    assert not r.passed and r.interval.high > 3 > r.interval.low > -3


def test_pairs_by_seed_not_by_order_and_metric_choice(tmp_path):
    on = [write_run(tmp_path, "a", 7, True, 300.0, ledger=290.0),
          write_run(tmp_path, "b", 5, True, 200.0, ledger=100.0)]
    off = [write_run(tmp_path, "c", 5, False, 200.0, ledger=200.0),
           write_run(tmp_path, "d", 7, False, 300.0, ledger=290.0)]
    r = fidelity(on, off)  # request-span metric: identical pairs -> effects 0, 0
    assert [(p.seed, p.effect) for p in r.pairs] == [(5, 0.0), (7, 0.0)] and r.passed
    r = fidelity(on, off, metric="throughput_ledger_tok_s")
    assert r.pairs[0].effect == pytest.approx(100 * math.log(0.5)) and not r.passed


@pytest.mark.parametrize("problem,needle", [
    ("unpaired", "not paired by seed"),
    ("dup", "twice"),
    ("trace-flag", "trace=false"),
    ("missing", "no summary.json"),
    ("bad-value", "positive number"),
    ("one-pair", "at least 2"),
])
def test_bad_inputs_raise(tmp_path, problem, needle):
    on, off = runs(tmp_path, [100.0, 101.0, 99.0], [100.0, 100.0, 100.0])
    if problem == "unpaired":
        off[2] = write_run(tmp_path, "x", 42, False, 100.0)
    elif problem == "dup":
        on.append(write_run(tmp_path, "x", 1, True, 100.0))
    elif problem == "trace-flag":
        on[0] = off[0]
    elif problem == "missing":
        (on[0] / "summary.json").unlink()
    elif problem == "bad-value":
        write_run(tmp_path, "x", 0, True, -5.0)
        on[0] = tmp_path / "x"
    elif problem == "one-pair":
        on, off = on[:1], off[:1]
    with pytest.raises(FidelityError, match=needle):
        fidelity(on, off)


def test_read_summary_rejects_non_int_seed(tmp_path):
    d = write_run(tmp_path, "r", 1, True, 100.0)
    (d / "summary.json").write_text(json.dumps({"seed": "1", "trace": True,
                                                "throughput_tok_s": 1.0}))
    with pytest.raises(FidelityError, match="seed"):
        read_summary(d)


def test_cli_exit_codes_and_output(tmp_path, capsys):
    on, off = runs(tmp_path, [100.0, 100.5, 99.8], [100.0, 100.0, 100.0])
    code = main(["fidelity", "--on", *map(str, on), "--off", *map(str, off)])
    out = capsys.readouterr().out
    assert code == 0 and out.strip().endswith("PASS") and "90% paired-t interval" in out
    code = main(["fidelity", "--on", *map(str, on), "--off", *map(str, off), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["verdict"] == "PASS" and d["n"] == 3
    assert len(d["interval_log_points"]) == 2

    (tmp_path / "fail").mkdir()
    bad_on, bad_off = runs(tmp_path / "fail", [110.0, 90.0, 120.0], [100.0, 100.0, 100.0])
    code = main(["fidelity", "--on", *map(str, bad_on), "--off", *map(str, bad_off)])
    assert code == 1 and capsys.readouterr().out.strip().endswith("FAIL")

    code = main(["fidelity", "--on", str(on[0]), "--off", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and "no summary.json" in err and len(err.strip().splitlines()) == 1


def test_cli_plot_and_help(tmp_path, capsys):
    on, off = runs(tmp_path, [100.0, 100.5, 99.8], [100.0, 100.0, 100.0])
    png = tmp_path / "f.png"
    code = main(["fidelity", "--on", *map(str, on), "--off", *map(str, off), "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0 and f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        main(["fidelity", "--help"])
    helptext = capsys.readouterr().out
    assert "90% paired-t" in helptext and "%%" not in helptext


def test_cpu_metric_is_a_choice(tmp_path, capsys):
    on, off = runs(tmp_path, [100.0, 100.0, 100.0], [100.0, 100.0, 100.0],
                   throughput_cpu_tok_s=50.0)
    code = main(["fidelity", "--on", *map(str, on), "--off", *map(str, off),
                 "--metric", "throughput_cpu_tok_s", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["metric"] == "throughput_cpu_tok_s" and d["mean_log_points"] == 0.0
