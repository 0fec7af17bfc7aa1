"""The run's metrics.parquet: one row per iteration, idempotent by (run_id, iteration)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from distppo.telemetry.schema import ITERATION_SCHEMA, validate_row


class ParquetSink:
    """All iteration rows of a run in one Parquet file, idempotent by (run_id, iteration).

    The whole file is rewritten on each flush: a run has at most some ten thousand rows, and a
    rewrite-and-rename never leaves a half-written file behind after a crash.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._rows: dict[tuple[str, int], dict] = {}
        if self.path.exists():  # a resumed run keeps its earlier rows
            for row in pq.read_table(self.path).to_pylist():
                self._rows[(row["run_id"], row["iteration"])] = validate_row(row)

    def write(self, row: Mapping, flush: bool = True) -> None:
        """Add a row; one with the same (run_id, iteration) replaces the old one."""
        row = validate_row(row)
        self._rows[(row["run_id"], row["iteration"])] = row
        if flush:
            self.flush()

    def truncate_after(self, iteration: int, flush: bool = True) -> None:
        """Drop rows past `iteration`: on resume from a checkpoint they will be produced again."""
        self._rows = {k: r for k, r in self._rows.items() if k[1] <= iteration}
        if flush:
            self.flush()

    def rows(self) -> list[dict]:
        return [self._rows[k] for k in sorted(self._rows)]

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self.rows(), schema=ITERATION_SCHEMA)
        # Same folder as the target so os.replace is an atomic rename on one file system.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # the old file is untouched; leave no debris beside it
            raise
