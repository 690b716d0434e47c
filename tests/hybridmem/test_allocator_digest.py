"""The behaviour digest of ``benchmarks/allocator_digest.py`` (the A/B check of allocator
speed-ups): deterministic, sensitive to a plausible fault, and the disabled-observer path gives
the same results as the recording path (each equality beside its negative control)."""

import pytest

from benchmarks.allocator_digest import POLICIES, DigestObserver, lru_fault, random_ops
from hybridmem.events import NullObserver
from hybridmem.geometry import PRESETS
from hybridmem.memory.organization import MemoryOrganization
from hybridmem.units import derive_units

U = derive_units(PRESETS["falcon-h1-7b"])
STEPS = 120


def digest(name, policy, observer=None):
    rec = observer if observer is not None else DigestObserver()
    trace = random_ops(name, U, policy, rec, steps=STEPS)
    return rec.h.hexdigest() if isinstance(rec, DigestObserver) else "", trace.h.hexdigest()


@pytest.mark.parametrize("name", ["S0", "S1", "S2", "D0"])
def test_digest_is_deterministic_and_sees_an_lru_fault(name):
    policy = POLICIES["pin2-ret"]
    first = digest(name, policy)
    assert digest(name, policy) == first
    with lru_fault():  # negative control: newest cached page reclaimed first
        faulty = digest(name, policy)
    assert faulty[0] != first[0] and faulty[1] != first[1]


@pytest.mark.parametrize("name", ["S2", "D0"])
def test_null_observer_path_agrees_with_recording_path(name, monkeypatch):
    policy = POLICIES["pin1-salt"]
    _, recorded = digest(name, policy)
    _, null = digest(name, policy, NullObserver())
    assert null == recorded
    # negative control: a fault only on the non-emitting path is seen
    orig = MemoryOrganization.publish

    def publish(self, request_id, num_computed):
        out = orig(self, request_id, num_computed)
        return out if self._emitting else out[:-1]

    monkeypatch.setattr(MemoryOrganization, "publish", publish)
    _, null_faulty = digest(name, policy, NullObserver())
    assert null_faulty != recorded
