"""Names spelled once (ground layer; imports nothing): environment variables and the keys of a
trace's metadata, which the writer, the exporter, the lineage tables and the engines share.

Environment variables::

    HYBRIDMEM_TRACE            trace file the vLLM plugin writes (unset: no tracing)
    HYBRIDMEM_TRACE_META       JSON object merged into the trace metadata
    HYBRIDMEM_CPU_PREFIX_FIX   "0" disables the plugin's CPU prefix-caching fix
    HYBRIDMEM_TRACEBACK        "1": the CLI prints the traceback of an unexpected error
    HYBRIDMEM_SLOW             "1": run the tests marked slow

Trace metadata (the file header's JSON; Parquet schema metadata under ``TABLE_META_KEY``)::

    {"organization": "S2", "attention_grid_tokens": 512, "recurrent_grid_tokens": 512,
     "verdict": {...}, ...}
"""

from __future__ import annotations

ENV_TRACE = "HYBRIDMEM_TRACE"
ENV_TRACE_META = "HYBRIDMEM_TRACE_META"
ENV_CPU_PREFIX_FIX = "HYBRIDMEM_CPU_PREFIX_FIX"
ENV_TRACEBACK = "HYBRIDMEM_TRACEBACK"
ENV_SLOW = "HYBRIDMEM_SLOW"

TABLE_META_KEY = b"hybridmem.meta"  # Arrow/Parquet schema metadata key of the run metadata
META_ORGANIZATION = "organization"
META_ATTENTION_GRID = "attention_grid_tokens"
META_RECURRENT_GRID = "recurrent_grid_tokens"
META_VERDICT = "verdict"
META_REQUIRED = (META_ORGANIZATION, META_ATTENTION_GRID, META_RECURRENT_GRID)
