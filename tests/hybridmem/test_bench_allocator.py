"""The allocator benchmark runs its mix to completion on every organization (small workload)."""

from benchmarks.bench_allocator import main, run_mix, workload
from hybridmem.events import EventKind, RecordingObserver
from hybridmem.geometry import PRESETS
from hybridmem.units import derive_units


def test_mix_exercises_every_operation():
    units = derive_units(PRESETS["falcon-h1-7b"])
    prompts = workload(30)
    for name in ("S0", "S1", "S2", "D0"):
        rec = RecordingObserver()
        ops = run_mix(name, units, "b63", prompts, rec)
        kinds = {e.kind for e in rec.events}
        assert ops > 30 * 5
        assert {EventKind.ALLOCATION, EventKind.PUBLICATION, EventKind.ADOPTION,
                EventKind.RELEASE, EventKind.LOSS} <= kinds, (name, kinds)


def test_main_prints_one_table(capsys):
    assert main(["--requests", "12", "--repeat", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["org", "ops", "seconds", "ops/s"]
    assert [line.split()[0] for line in out[1:5]] == ["S0", "S1", "S2", "D0"]
    # vLLM rows follow: timed (vLLM@512, vLLM@16: D0's grid) or a line saying why not
    assert out[5].startswith("vLLM") and len(out) in (6, 7)


def test_hash_floor_prints_every_row(capsys):
    assert main(["--requests", "6", "--repeat", "1", "--hash-floor"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["vLLM@512", "vLLM@16", "S0", "S1", "S2", "D0"]
    assert "two chains (16/1792)" in out[-1] and "ceiling vs vLLM@512" in out[-1]
