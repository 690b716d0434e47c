"""Opening a run for lineage: a binary trace (verified first, through the tracer) or an exported
Parquet event table.

A path ending in ``.parquet`` is an event table; anything else is a binary trace read by
``tracer.verify`` / ``tracer.events_table`` (imported only then). A trace whose verdict is not
accepted (no END record, a sequence gap, dropped records, write errors) is refused unless the
caller allows unverified input; the result then says so. A Parquet table carries the verdict
of the trace it was exported from in its run metadata, when there was one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from hybridmem.errors import HybridMemError
from lineage.table import RunMeta, check_columns, table_meta


class UnverifiedTraceError(HybridMemError):
    """A trace whose verdict is not accepted, opened without ``allow_unverified``."""


@dataclass(frozen=True, slots=True)
class Run:
    path: str
    table: pa.Table
    meta: RunMeta
    verified: bool | None  # True accepted, False refused verdict, None: no verdict available
    verdict_reason: str

    @property
    def verification(self) -> str:
        if self.verified is True:
            return "accepted"
        if self.verified is False:
            return f"UNVERIFIED ({self.verdict_reason})"
        return f"no trace verdict ({self.verdict_reason})"


def _meta_verdict(meta: RunMeta) -> tuple[bool | None, str]:
    v: Any = meta.extra.get("verdict")
    if v is None:
        return None, "event table without an embedded trace verdict"
    if isinstance(v, dict) and isinstance(v.get("accepted"), bool):
        return v["accepted"], str(v.get("reason", ""))[:200]
    if isinstance(v, bool):
        return v, "verdict recorded in the table metadata"
    raise HybridMemError(f"run metadata 'verdict' must be an object with a boolean 'accepted' "
                         f"(or a boolean), got {v!r:.60}")


def open_run(path: str | Path, allow_unverified: bool = False,
             columns: Sequence[str] | None = None) -> Run:
    """Load ``path`` as an event table, refusing unaccepted traces unless allowed.

    Every shared column must be in the file; ``columns`` (e.g.
    :data:`lineage.table.LINEAGE_COLUMNS`, what a report reads) keeps only those in
    ``Run.table``: a Parquet file then decodes only them (over 1M events ~0.6x the time and
    memory of the whole table)."""
    p = Path(path)
    if not p.exists():
        raise HybridMemError(f"{p}: no such file")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(p)
            check_columns(schema.empty_table(), str(p))
            table = pq.read_table(p, columns=list(columns) if columns is not None else None)
        except (OSError, pa.ArrowInvalid) as exc:
            raise HybridMemError(f"{p}: not a readable Parquet file ({exc})") from None
        table = table.replace_schema_metadata(schema.metadata)
        meta = table_meta(table, str(p))
        try:
            verified, reason = _meta_verdict(meta)
        except HybridMemError as exc:
            raise HybridMemError(f"{p}: {exc}") from None
    else:
        from tracer import events_table

        # one pass: the table carries the reader's verdict in its metadata; a binary trace
        # always has every column, so only ``columns`` are decoded
        table = events_table(str(p), columns)
        check_columns(table, str(p), columns)
        if columns is not None:
            table = table.select(list(columns))  # in the caller's order, as from Parquet
        meta = table_meta(table, str(p))
        verified, reason = _meta_verdict(meta)
        if not verified and not allow_unverified:
            raise UnverifiedTraceError(f"{p}: trace not accepted ({reason}); "
                                       "--allow-unverified analyses it anyway")
    if verified is False and not allow_unverified:
        raise UnverifiedTraceError(f"{p}: its trace verdict is not accepted ({reason}); "
                                   "--allow-unverified analyses it anyway")
    return Run(str(p), table, meta, verified, reason)
