"""hybridmem's counters on vLLM's ``/metrics``: pool units, losses by cause, adoptions.

``vllm serve`` runs its scheduler in the engine-core process (a child of the API server, even
with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which only keeps the worker inside the engine core),
while ``/metrics`` is served by the API server from prometheus_client's default registry. So the
counters cross the process boundary as a small JSON snapshot::

    engine core (OrgScheduler)                         API server (plugin's register())
    ------------------------------------------         -----------------------------------------
    Reporter: an event observer beside the trace;      Collector in prometheus_client.REGISTRY:
    snapshot() reads the organization's public         on each scrape reads the snapshot
    state (pools(), held()) and the manager's           <dir>/<API server pid>.json and yields
    counters; written (temp file + rename) to          the families below (nothing when there
    <dir>/<parent pid>.json at start, at most every    is no snapshot: an --org vllm server
    WRITE_INTERVAL_S while serving, whenever the       shows none)
    engine goes idle; removed at shutdown (or exit;
    a killed engine core leaves its file, which the
    next engine core of a server with that pid
    replaces at its start, before it serves)

``<dir>`` is ``HYBRIDMEM_METRICS_DIR`` or ``<tmp>/hybridmem-metrics-<uid>``. The reporter is on
only in a process vLLM started as its engine core (``multiprocessing`` name ``EngineCore...``);
an in-process engine (``hybridmem run``) has none. ``HYBRIDMEM_METRICS=0`` turns it off. When
``PROMETHEUS_MULTIPROC_DIR`` is set vLLM serves a multiprocess registry instead of the default
one, and these families do not appear there.

Families (``pool``: ``shared`` for S0-S2, ``attention`` / ``recurrent`` for D0; units are the
organization's: pages of its grid, D0 attention units and composites)::

    hybridmem:info{organization,budget,grid_tokens,interval_tokens}   gauge, 1
    hybridmem:units_capacity{pool}      units in the pool
    hybridmem:units_free{pool}          units holding nothing
    hybridmem:units_cached{pool}        units holding only discoverable (reclaimable) state
    hybridmem:units_in_use{pool}        units referenced by a running or waiting request
    hybridmem:held{kind}                attention blocks / checkpoints / slabs held (in use or
                                        cached)
    hybridmem:losses_total{cause,state_kind}      LOSS events (supply lost), by cause
    hybridmem:publications_total{state_kind}      PUBLICATION events
    hybridmem:adoptions_total                      ADOPTION events (every admission adopts,
                                                   a depth of 0 included)
    hybridmem:adopted_tokens_total                 sum of their depths (joint prefix-hit
                                                   tokens J)
    hybridmem:admissions_total, hybridmem:admission_rejections_total,
    hybridmem:preemptions_total, hybridmem:finished_total   the KV-cache manager's counters

Counters count from the engine core's start; the trace of the same run holds the same events
(the reporter and the trace writer see one event stream).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hybridmem.events import Cause, Event, EventKind, StateKind

DIR_ENV = "HYBRIDMEM_METRICS_DIR"
SWITCH_ENV = "HYBRIDMEM_METRICS"  # "0": no reporter in the engine core
WRITE_INTERVAL_S = 0.5
PREFIX = "hybridmem:"
MANAGER_COUNTERS = ("admissions", "admission_rejections", "preemptions", "finished")


def metrics_dir() -> Path:
    raw = os.environ.get(DIR_ENV)
    if raw:
        return Path(raw)
    return Path(tempfile.gettempdir()) / f"hybridmem-metrics-{os.getuid()}"


def snapshot_path(server_pid: int) -> Path:
    return metrics_dir() / f"{server_pid}.json"


def in_engine_core() -> bool:
    """True in a process vLLM started as its engine core (its parent serves ``/metrics``)."""
    return (multiprocessing.parent_process() is not None
            and multiprocessing.current_process().name.startswith("EngineCore"))


# -- engine-core side ---------------------------------------------------------------------------
class Reporter:
    """Counts the organization's events; :meth:`snapshot` adds its public pool state."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.losses: Counter[tuple[str, str]] = Counter()
        self.publications: Counter[str] = Counter()
        self.adoptions = 0
        self.adopted_tokens = 0
        self.org: Any = None
        self.manager: Any = None
        self.plan: Any = None
        self._last = 0.0

    def attach(self, org: Any, manager: Any, plan: Any) -> None:
        self.org, self.manager, self.plan = org, manager, plan

    def on_event(self, event: Event) -> None:
        kind = event.kind
        if kind is EventKind.LOSS:
            self.losses[Cause(event.cause).name.lower(),
                        StateKind(event.state_kind).name.lower()] += 1
        elif kind is EventKind.PUBLICATION:
            self.publications[StateKind(event.state_kind).name.lower()] += 1
        elif kind is EventKind.ADOPTION:
            self.adoptions += 1
            self.adopted_tokens += event.depth

    def snapshot(self) -> dict[str, Any]:
        pools = []
        held: dict[str, int] = {}
        if self.org is not None:
            for pool in self.org.pools():
                pools.append({"pool": pool.name, "capacity": pool.total, "free": pool.num_free,
                              "cached": pool.num_cached, "in_use": pool.num_in_use})
            h = self.org.held()
            held = {"attention_blocks": h.attention, "checkpoints": h.recurrent,
                    "slabs": h.slabs}
        info: dict[str, str] = {}
        if self.plan is not None:
            info = {"organization": str(self.plan.settings.org),
                    "budget": str(self.plan.settings.budget),
                    "grid_tokens": str(self.plan.grid),
                    "interval_tokens": str(self.plan.interval)}
        counters = dict(getattr(self.manager, "counters", {}) or {})
        return {
            "pid": os.getpid(), "time": time.time(), "info": info, "pools": pools,
            "held": held,
            "losses": [{"cause": c, "state_kind": k, "count": n}
                       for (c, k), n in sorted(self.losses.items())],
            "publications": dict(sorted(self.publications.items())),
            "adoptions": self.adoptions, "adopted_tokens": self.adopted_tokens,
            "counters": {k: int(counters.get(k, 0)) for k in MANAGER_COUNTERS},
        }

    def write(self, force: bool = False) -> None:
        """Write the snapshot when ``force`` or WRITE_INTERVAL_S has passed since the last."""
        now = time.monotonic()
        if self.path is None or (not force and now - self._last < WRITE_INTERVAL_S):
            return
        self._last = now
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # a scrape reads a whole snapshot, never a half-written one (no fsync: a snapshot
            # that does not survive a crash is replaced by the next engine core's first)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.snapshot()))
            os.replace(tmp, self.path)
        except OSError:
            self.path = None  # metrics are best effort: serving goes on without them

    def close(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def engine_core_reporter() -> Reporter | None:
    """A reporter writing for the API server that started this engine core; None elsewhere (an
    in-process engine) or with ``HYBRIDMEM_METRICS=0``."""
    if os.environ.get(SWITCH_ENV) == "0" or not in_engine_core():
        return None
    reporter = Reporter(snapshot_path(os.getppid()))
    atexit.register(reporter.close)  # also when the engine core exits without its shutdown
    return reporter


# -- API-server side ----------------------------------------------------------------------------
def families(snap: dict[str, Any]) -> Iterator[Any]:
    """Prometheus metric families of one snapshot."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    info = snap.get("info") or {}
    if info:
        g = GaugeMetricFamily(PREFIX + "info", "the memory organization serving this engine",
                              labels=sorted(info))
        g.add_metric([info[k] for k in sorted(info)], 1)
        yield g
    docs = {"capacity": "units in the pool", "free": "units holding nothing",
            "cached": "units holding only discoverable (reclaimable) state",
            "in_use": "units referenced by a request"}
    for key, doc in docs.items():
        g = GaugeMetricFamily(f"{PREFIX}units_{key}", doc + " (organization units)",
                              labels=["pool"])
        for p in snap.get("pools", []):
            g.add_metric([str(p["pool"])], p[key])
        yield g
    g = GaugeMetricFamily(PREFIX + "held", "blocks, checkpoints and slabs held (in use or "
                          "cached)", labels=["kind"])
    for kind, n in (snap.get("held") or {}).items():
        g.add_metric([kind], n)
    yield g
    c = CounterMetricFamily(PREFIX + "losses", "discoverable state lost, by cause",
                            labels=["cause", "state_kind"])
    for row in snap.get("losses", []):
        c.add_metric([row["cause"], row["state_kind"]], row["count"])
    yield c
    c = CounterMetricFamily(PREFIX + "publications", "state made discoverable",
                            labels=["state_kind"])
    for kind, n in (snap.get("publications") or {}).items():
        c.add_metric([kind], n)
    yield c
    yield CounterMetricFamily(PREFIX + "adoptions", "admissions adopting a joint prefix hit "
                              "(depth 0 included)", value=snap.get("adoptions", 0))
    yield CounterMetricFamily(PREFIX + "adopted_tokens", "tokens adopted at admission (joint "
                              "prefix-hit depth J)", value=snap.get("adopted_tokens", 0))
    for name, n in (snap.get("counters") or {}).items():
        yield CounterMetricFamily(PREFIX + name, f"KV-cache manager: {name.replace('_', ' ')}",
                                  value=n)


class Collector:
    """Reads this process's snapshot at every scrape (prometheus_client custom collector)."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def describe(self) -> list[Any]:
        return []  # no fixed names: the registry then never calls collect() at registration

    def collect(self) -> Iterator[Any]:
        try:
            snap = json.loads(snapshot_path(self.server_pid).read_text())
        except (OSError, ValueError):
            return
        if isinstance(snap, dict):
            yield from families(snap)


_REGISTERED: list[Collector] = []


def register_collector() -> bool:
    """Add the collector to prometheus_client's default registry (idempotent; not in an
    engine core, whose registry nobody serves). False when prometheus_client is missing."""
    if _REGISTERED or in_engine_core():
        return bool(_REGISTERED)
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return False
    collector = Collector(os.getpid())
    REGISTRY.register(collector)
    _REGISTERED.append(collector)
    return True
