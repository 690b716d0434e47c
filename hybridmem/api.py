"""The few entry points a notebook needs, behind ``import hybridmem``::

    import hybridmem

    p = hybridmem.plan("falcon-h1-7b", "b63", attention_fraction=0.5)  # pages per organization
    org = hybridmem.organization("S2", "falcon-h1-7b", "b63")           # an allocator to drive
    con = hybridmem.open_lineage("out/run/trace.hmt")                    # DuckDB, lineage views
    con.sql("SELECT count(*) FROM episode_lineage").fetchall()
    t = hybridmem.trace_events("out/run/trace.hmt")                      # the events, as Arrow

Budgets are the paper's per-layer labels (``b63``; arXiv 2610.15755, Table B-2) or a whole-cache
size with ``total=`` (as vLLM's ``--kv-cache-memory-bytes``). Model names are those of
``hybridmem plan --help`` (``falcon-h1-7b``, ``tiny``, ...) or a directory with a
``config.json``. Each function is what the CLI runs for the same question, not a second path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from hybridmem.budget import Plan
    from hybridmem.memory.organization import MemoryOrganization
    from hybridmem.units import Units

DEFAULT_MODEL = "falcon-h1-7b"


def model_units(model: str = DEFAULT_MODEL) -> Units:
    """The allocation units of ``model`` (bytes per layer) at the grid it is served on; D0's
    16-token unit and checkpoint interval are fields of the same units."""
    from hybridmem.cli import models

    return models.units(model)


def plan(model: str = DEFAULT_MODEL, budget: str | None = None, *, total: str | None = None,
         attention_fraction: float | None = None) -> Plan:
    """The budget plan (pages of S0-S2, D0's two pools) of ``hybridmem plan``; exactly one of
    ``budget`` (a label such as ``"b63"``) and ``total`` (a size such as ``"12GiB"``)."""
    from hybridmem.budget import TOTAL_PREFIX, parse_budget, plan_budget
    from hybridmem.errors import HybridMemError

    if (budget is None) == (total is None):
        raise HybridMemError("give exactly one of budget (e.g. 'b63') and total (e.g. '12GiB')")
    u = model_units(model)
    text = budget if total is None else TOTAL_PREFIX + total  # parse_budget reads a total's label
    return plan_budget(u, parse_budget(str(text), u), attention_fraction).check_holds()


def organization(name: str, model: str = DEFAULT_MODEL, budget: str = "b63", *,
                 attention_fraction: float | None = 0.5, **policy: Any) -> MemoryOrganization:
    """Organization ``name`` (S0, S1, S2 or D0) sized by ``budget`` for ``model``: drive it with
    ``add_request``, ``lookup``, ``adopt``, ``allocate``, ``publish``, ``finish`` (see
    ``hybridmem/ORGANIZATIONS.md``). ``policy`` passes pinning and retention settings."""
    from hybridmem.memory.layouts import make_organization

    p = plan(model, budget, attention_fraction=attention_fraction)
    return make_organization(name, model_units(model), p, **policy)


def trace_events(run: str) -> pa.Table:
    """A run's events (a trace or a Parquet export) as an Arrow table; an unaccepted trace is
    refused, as by ``hybridmem lineage``."""
    from lineage.source import open_run

    return open_run(run).table


def open_lineage(*runs: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the lineage views (``hybridmem lineage views`` lists them) over
    one run, or over several with ``run`` and ``organization`` columns first, as
    ``hybridmem lineage query RUN1 RUN2 ...``."""
    from hybridmem.errors import HybridMemError
    from lineage.source import open_run
    from lineage.views import connect, describe_views

    if not runs:
        raise HybridMemError("open_lineage needs at least one run")
    opened = [open_run(r) for r in runs]
    if len(opened) == 1:
        return connect(opened[0].table, opened[0].meta, source=opened[0].path)
    from lineage.multirun import connect_runs

    names = " ".join(["events"] + [v.name for v in describe_views()])
    return connect_runs(opened, names)
