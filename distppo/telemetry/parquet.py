"""The run's metrics: one row per iteration, idempotent by (run_id, iteration), O(1) per row.

Two files in the run folder:
- `metrics.parquet`: every row up to the last flush, replaced atomically and durably
  (telemetry/files.py), so it is always a whole Parquet file.
- `metrics.tail.jsonl`: the rows written since that flush, one JSON object per line, appended.

`write(row, flush=False)` appends one line: its cost does not grow with the run (rewriting the
whole Parquet file per row does; `distppo bench --sink-rows` measures both). `flush()`
rewrites metrics.parquet with every row and empties the tail. The loop flushes before each
checkpoint, so the rows a checkpoint stands for are on disk before it is; at the end of the
run; and at least once a minute, so metrics.parquet alone is never more than a minute behind
a live run. `read_metrics` reads both files, which is what a resumed run starts from.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distppo.errors import UserError
from distppo.telemetry.files import atomic_write, remove_quietly, storage_error
from distppo.telemetry.runlayout import tail_name
from distppo.telemetry.schema import ITERATION_SCHEMA, validate_row


def tail_path(path: str | os.PathLike) -> Path:
    """metrics.parquet -> metrics.tail.jsonl beside it."""
    return Path(tail_name(os.fspath(path)))


class ParquetSink:
    """All iteration rows of a run, idempotent by (run_id, iteration); see the module doc."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.tail = tail_path(self.path)
        self._rows: dict[tuple[str, int], dict] = {}
        for row in read_rows(self.path):  # a resumed run keeps its earlier rows
            self._rows[(row["run_id"], row["iteration"])] = row
        self._tail_file = None
        self.last_flush = time.monotonic()
        # the rows of the last flush as a table, so a flush converts only newer rows (Arrow
        # from Python dicts costs more than the Parquet write at 10k rows); None = rebuild
        self._table: pa.Table | None = None
        self._in_table: set[tuple[str, int]] = set()
        self._pending: set[tuple[str, int]] = set()

    def write(self, row: Mapping, flush: bool = True) -> None:
        """Add a row; one with the same (run_id, iteration) replaces the old one. flush=False
        appends it to the tail (O(1)); flush=True rewrites metrics.parquet (O(rows))."""
        row = validate_row(row)
        self._rows[(row["run_id"], row["iteration"])] = row
        self._pending.add((row["run_id"], row["iteration"]))
        if flush:
            self.flush()
        else:
            self._append(row)

    def truncate_after(self, iteration: int, flush: bool = True) -> None:
        """Drop rows past `iteration`: on resume from a checkpoint they will be produced again."""
        self._rows = {k: r for k, r in self._rows.items() if k[1] <= iteration}
        self._table = None
        if flush:
            self.flush()

    def rows(self) -> list[dict]:
        return [self._rows[k] for k in sorted(self._rows)]

    def seconds_since_flush(self) -> float:
        return time.monotonic() - self.last_flush

    def flush(self) -> None:
        """metrics.parquet := every row (durable), then the tail is emptied. A crash between
        the two leaves tail rows that metrics.parquet already holds: replaying them is a no-op."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = self._as_table()
        atomic_write(str(self.path), lambda tmp: pq.write_table(table, tmp))
        self._table, self._in_table, self._pending = table, set(self._rows), set()
        self.close()
        remove_quietly(str(self.tail))
        self.last_flush = time.monotonic()

    def _as_table(self) -> pa.Table:
        """Every row as one table sorted by key: the cached table of the last flush, less the
        rows written again since, plus the rows written since."""
        if self._table is None:
            return pa.Table.from_pylist(self.rows(), schema=ITERATION_SCHEMA)
        table, replaced = self._table, self._pending & self._in_table
        if replaced:
            keys = zip(table["run_id"].to_pylist(), table["iteration"].to_pylist())
            table = table.filter(pa.array([k not in replaced for k in keys]))
        new = pa.Table.from_pylist([self._rows[k] for k in sorted(self._pending)],
                                   schema=ITERATION_SCHEMA)
        return pa.concat_tables([table, new]).sort_by(
            [("run_id", "ascending"), ("iteration", "ascending")])

    def close(self) -> None:
        if self._tail_file is not None:
            self._tail_file.close()  # unbuffered: nothing left to write, so nothing can fail
            self._tail_file = None

    def _append(self, row: dict) -> None:
        # one JSON line; json keeps floats exact (repr) and writes NaN as NaN
        data = (json.dumps(row) + "\n").encode()
        try:
            if self._tail_file is None:
                self.tail.parent.mkdir(parents=True, exist_ok=True)
                _cut_torn_line(self.tail)
                self._tail_file = open(self.tail, "ab", buffering=0)
            while data:  # a raw write may be short (a full disk): the next one raises
                data = data[self._tail_file.write(data):]
        except OSError as exc:
            self.close()
            raise storage_error(str(self.tail), exc) from None


def read_rows(path: str | os.PathLike, filesystem: pafs.FileSystem | None = None,
              columns: Sequence[str] | None = None, lenient: bool = False) -> list[dict]:
    """The rows of metrics.parquet and its tail, later ones replacing earlier ones by key,
    sorted by (run_id, iteration).

    `filesystem`: a pyarrow file system that holds `path` (a sweep's run copy on S3); the
    local one by default. `columns`: only these (and the key), unvalidated, so a 10k-row run
    is cheap to glance at. A damaged metrics.parquet or tail line is one UserError line, but
    `lenient` (a reader of a live sweep, whose files a newer copy may delete under it) reads
    what it can: a file that cannot be read gives no rows, a damaged line is skipped.
    """
    fs = filesystem or pafs.LocalFileSystem()
    where = os.fspath(path) if filesystem else os.path.abspath(path)
    rows: dict[tuple[str, int], dict] = {}
    try:
        with fs.open_input_file(where) as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names  # an older run may lack a column
            wanted = None if columns is None else \
                [c for c in dict.fromkeys(("run_id", "iteration", *columns)) if c in names]
            stored = parquet.read(columns=wanted).to_pylist()
    except FileNotFoundError:
        stored = []
    except (OSError, pa.ArrowException) as exc:
        if not lenient:
            raise UserError(f"{path} cannot be read ({type(exc).__name__}): it is empty or "
                            "damaged; restore it from a copy, or move it away to continue "
                            "without its rows") from None
        stored = []
    for row in stored:
        rows[(row["run_id"], row["iteration"])] = row if columns else validate_row(row)
    for row in _tail_rows(fs, tail_name(where), lenient):
        if columns:
            row = {k: row[k] for k in ("run_id", "iteration", *columns) if k in row}
        rows[(row["run_id"], row["iteration"])] = row
    return [rows[k] for k in sorted(rows)]


def read_metrics(path: str | os.PathLike) -> pa.Table:
    """Every row of a run (metrics.parquet and its tail) as one table: `.to_pandas()` it."""
    return pa.Table.from_pylist(read_rows(path), schema=ITERATION_SCHEMA)


def _tail_rows(fs: pafs.FileSystem, tail: str, lenient: bool) -> list[dict]:
    try:
        with fs.open_input_stream(tail) as f:
            text = f.readall().decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    except (OSError, pa.ArrowException):
        if lenient:
            return []
        raise
    rows = []
    lines = text.split("\n")
    # the text after the last newline is a line a killed writer did not finish: not a row
    for number, line in enumerate(lines[:-1], start=1):
        try:
            rows.append(validate_row(json.loads(line)))
        except ValueError as exc:
            if lenient:
                continue
            raise UserError(f"{tail} line {number} is damaged ({exc}): move the file away to "
                            "continue without the rows since the last flush") from None
    return rows


def _cut_torn_line(tail: Path) -> None:
    """Drop an unfinished last line before appending, so the next row starts a line."""
    try:
        data = tail.read_bytes()
    except FileNotFoundError:
        return
    end = data.rfind(b"\n") + 1
    if end != len(data):
        os.truncate(tail, end)

