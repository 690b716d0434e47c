"""``trace bench`` times the disabled path as the organizations' call sites pay it (a guard on
an instance flag: no call, no Event) beside the unguarded ``NULL_WRITER.on_event`` figure."""

from hybridmem.events import RecordingObserver
from tracer.bench import _CallSite, run_bench
from tracer.synthetic import synthetic_events


def test_call_site_guard_makes_no_call_when_disabled():
    events = list(synthetic_events(50))
    site = _CallSite()
    rec = RecordingObserver()
    site.observer = rec  # type: ignore[assignment]  # the flag stays False: nothing arrives
    site.run(events)
    assert rec.events == []
    site._emitting = True  # negative control: the same loop enabled delivers every event
    site.run(events)
    assert rec.events == events


def test_bench_reports_call_site_and_net_figures(tmp_path):
    r = run_bench(300, str(tmp_path / "b.hmtrace"), repeats=1)
    for name in ("disabled", "disabled_guard", "disabled_call_site"):
        gross, net = r[f"ns_per_event_{name}"], r[f"ns_per_event_{name}_net"]
        assert 0 <= net <= gross, (name, gross, net)
    assert r["accepted"]
