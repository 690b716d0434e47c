"""Rows split into one Arrow IPC file per partition (a key partition, an episode range), appended
batch by batch and read back memory-mapped: the scratch files of lineage/bounded.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa


class PartWriter:
    """One Arrow IPC file per key partition, appended batch by batch (created on first rows)."""

    def __init__(self, directory: Path, stem: str, parts: int) -> None:
        self.paths = [directory / f"{stem}_{k:04d}.arrow" for k in range(parts)]
        self._writers: list[pa.ipc.RecordBatchFileWriter | None] = [None] * parts
        self.schema: pa.Schema | None = None

    def write(self, table: pa.Table, part: np.ndarray) -> None:
        """Append each row of ``table`` to the file of its partition ``part`` (uint64)."""
        self.schema = table.schema
        if not table.num_rows:
            return
        parts = len(self.paths)
        if parts == 1:
            self._append(0, table)
            return
        small = part.astype(np.uint16)  # parts <= 4096: a stable sort of these is a radix sort
        order = np.argsort(small, kind="stable")
        counts = np.bincount(small, minlength=parts)
        table = table.take(pa.array(order))
        at = 0
        for k, cnt in enumerate(counts.tolist()):
            if cnt:
                self._append(k, table.slice(at, cnt))
            at += cnt

    def _append(self, k: int, table: pa.Table) -> None:
        w = self._writers[k]
        if w is None:
            w = self._writers[k] = pa.ipc.new_file(str(self.paths[k]), table.schema)
        w.write_table(table)

    def close(self) -> None:
        for w in self._writers:
            if w is not None:
                w.close()
        self._writers = [None] * len(self._writers)

    def read(self, k: int, columns: list[str] | None = None) -> pa.Table | None:
        """Partition ``k``'s rows (memory-mapped), or None when it has none."""
        if not self.paths[k].exists():
            return None
        table = pa.ipc.open_file(pa.memory_map(str(self.paths[k]))).read_all()
        return table.select(columns) if columns is not None else table

    def remove(self) -> None:
        """Delete the files (closing them first)."""
        self.close()
        for p in self.paths:
            p.unlink(missing_ok=True)
