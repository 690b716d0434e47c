"""The shared set-up of the inline-path equality tests (test_inline_reclaim, test_block_reuse):
the allocator mix they run and a recording of every page pool's watcher calls."""

from __future__ import annotations

from typing import Any

from benchmarks.bench_allocator import workload
from hybridmem.geometry import PRESETS
from hybridmem.memory.pool import PagePool
from hybridmem.units import derive_units

U = derive_units(PRESETS["falcon-h1-7b"])
PROMPTS = workload(40)


def record_pool_calls(m: Any) -> list[tuple[Any, ...]]:
    """Patch (with ``m``, a ``monkeypatch.context()``) every page pool built from now on to
    append its watcher calls ``(pool, page, what)`` to the returned list."""
    calls: list[tuple[Any, ...]] = []
    real_init = PagePool.__init__

    def init(self: PagePool, name: str, num_pages: int) -> None:
        real_init(self, name, num_pages)
        self.watcher = lambda *call: calls.append(call)

    m.setattr(PagePool, "__init__", init)
    return calls
