"""A sweep's folder on any pyarrow file system, and the trials' run copies in it.

Layout: sweep/layout.py. Trials restore from, and the driver consolidates from, runs/ alone.
Tune's own record of checkpoints can lag the storage by a state snapshot (seconds); its
checkpoints are all kept (driver.py), so the one it names still exists, but the newest complete
run copy is what a trial restores from.
"""
from __future__ import annotations

import json
import os
import posixpath
import secrets
import shutil
from typing import Iterable, Iterator, Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distppo.errors import UserError
from distppo.sweep.layout import (
    FAULTS,
    KEEP_COPIES,
    RUNS,
    SWEEP_JSON,
    TRIAL_JSON,
    TUNER_STATE,
    absolute,
    filesystem,
    first_line,
)
from distppo.telemetry.faultlog import FaultLog
from distppo.telemetry.files import is_debris
from distppo.telemetry.redact import redact


class SweepStorage:
    """<storage>/<name> on a pyarrow file system: a local folder or any URI pyarrow resolves.

    Credentials come from the environment of each process (AWS_* variables, instance roles),
    never from files: only the URI string is stored, in Tune's state and in sweep.json.
    """

    def __init__(self, storage: str, name: str) -> None:
        self.storage = absolute(storage)
        self.name = name
        self.fs, root = filesystem(self.storage)
        self.path = posixpath.join(root, name)

    @classmethod
    def at(cls, fs: pafs.FileSystem, path: str, uri: str) -> "SweepStorage":
        """The sweep folder `path` on `fs`, already resolved from `uri` (<storage>/<name>)."""
        self = cls.__new__(cls)
        base, sep, query = absolute(uri).partition("?")
        storage, _, self.name = base.rstrip("/").rpartition("/")
        self.storage, self.fs, self.path = storage + sep + query, fs, path
        return self

    @property
    def location(self) -> str:
        """The sweep folder as Tune names it (storage URI + name, query string kept last)."""
        base, sep, query = self.storage.partition("?")
        return f"{base.rstrip('/')}/{self.name}{sep}{query}"

    @property
    def uri(self) -> str:
        """The sweep folder as printed: `location` with any credentials in it redacted."""
        return redact(self.location)

    def join(self, *parts: str) -> str:
        return posixpath.join(self.path, *parts)

    def exists(self, *parts: str) -> bool:
        return self._exists_path(self.join(*parts))

    def holds_sweep(self) -> bool:
        """Whether this is a sweep --resume can continue: its config and Tune's state."""
        return self.exists(SWEEP_JSON) and self.exists(TUNER_STATE)

    def first_missing(self) -> Optional[str]:
        """The outermost folder of the sweep path that does not exist yet (None if it does)."""
        missing, path = None, self.path
        while path not in ("", "/") and not self._exists_path(path):
            missing, path = path, posixpath.dirname(path)
        return missing

    def _exists_path(self, path: str) -> bool:
        try:
            return self.fs.get_file_info(path).type != pafs.FileType.NotFound
        except OSError as exc:
            raise UserError(f"storage {self.uri} cannot be read: {first_line(exc)}") from None

    def probe_write(self) -> None:
        """Write and delete a small file, so an unwritable storage fails now, not in a trial."""
        probe = self.join(".distppo_probe")
        try:
            self.fs.create_dir(self.path, recursive=True)
            with self.fs.open_output_stream(probe) as f:
                f.write(b"ok")
            self.fs.delete_file(probe)
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"storage {self.uri} cannot be written: {first_line(exc)}") from None

    def read_json(self, name: str) -> dict:
        with self.fs.open_input_stream(self.join(name)) as f:
            return json.loads(f.readall())

    def write_json(self, name: str, record: dict) -> None:
        with self.fs.open_output_stream(self.join(name)) as f:
            f.write(json.dumps(record, indent=2).encode())

    def write_table(self, name: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        """Stream tables into one Parquet file; written beside and moved into place, so a
        reader never sees half a file (a rename locally, copy+delete on object stores)."""
        tmp = self.join(f".{name}.tmp")
        rows = 0
        with pq.ParquetWriter(tmp, schema, filesystem=self.fs) as writer:
            for table in tables:
                writer.write_table(table)
                rows += table.num_rows
        self.fs.move(tmp, self.join(name))
        return rows

    def fault_log(self, trial_id: str) -> FaultLog:
        """The faults trial_id survived, over all its attempts and the driver's resumes."""
        return FaultLog(self.fs, self.join(FAULTS, trial_id))

    # -- run copies ----------------------------------------------------------------------------
    def run_copies(self, trial_id: str) -> list[str]:
        """Paths of the trial's run copies, newest (highest iteration) first; a hidden name
        is an upload in progress (or a killed one's debris), never a copy."""
        selector = pafs.FileSelector(self.join(RUNS, trial_id), allow_not_found=True)
        dirs = [i.path for i in self.fs.get_file_info(selector)
                if i.type == pafs.FileType.Directory and not i.base_name.startswith(".")]
        return sorted(dirs, key=posixpath.basename, reverse=True)

    def complete_run_copies(self, trial_id: str) -> Iterator[tuple[str, dict]]:
        """(path, trial.json) of each complete run copy, newest first."""
        for path in self.run_copies(trial_id):
            try:
                with self.fs.open_input_stream(posixpath.join(path, TRIAL_JSON)) as f:
                    yield path, json.loads(f.readall())
            except (OSError, ValueError):  # no trial.json yet, or a half-written one
                continue

    def latest_run_copy(self, trial_id: str) -> Optional[tuple[str, dict]]:
        """(path, trial.json) of the newest complete run copy, or None."""
        return next(self.complete_run_copies(trial_id), None)

    def upload_run(self, trial_id: str, iteration: int, run_dir: str, record: dict,
                   fence=None) -> str:
        """Copy run_dir to runs/<trial_id>/<iteration>, never deleting before it is whole.

        The files go to a hidden folder beside it, trial.json last (the mark of a complete
        copy), and only then take the copy's name: a rename locally; on object stores, where a
        folder cannot be renamed, each file moves with trial.json last again. A copy of the
        same iteration already there (a corrupt one a trial fell back from) loses its
        trial.json first, so a reader takes the older complete copy meanwhile, never a copy
        without its checkpoint. Killed writers' temp files and locks are not copied. Then all
        but the newest KEEP_COPIES complete copies are dropped.

        `fence` (lease.Fence): checked before the upload starts and again just before the copy
        takes its name, so a driver that lost its lease meanwhile adds no copy (LeaseLost).
        """
        parent = self.join(RUNS, trial_id)
        dest = posixpath.join(parent, f"{iteration:06d}")
        staging = posixpath.join(parent, f".{iteration:06d}.{secrets.token_hex(4)}.partial")
        if fence is not None:
            fence.check(self)
        self._drop_staging(parent)
        self.fs.create_dir(staging, recursive=True)
        for rel in _run_files(run_dir):
            if os.path.dirname(rel):
                self.fs.create_dir(posixpath.join(staging, os.path.dirname(rel)), recursive=True)
            with open(os.path.join(run_dir, rel), "rb") as src, \
                    self.fs.open_output_stream(posixpath.join(staging, rel)) as out:
                shutil.copyfileobj(src, out, 1 << 20)
        with self.fs.open_output_stream(posixpath.join(staging, TRIAL_JSON)) as f:
            f.write(json.dumps(record, indent=2).encode())
        if fence is not None:
            try:
                fence.check(self)
            except UserError:
                self.fs.delete_dir(staging)
                raise
        if self._exists_path(dest):
            self._delete_if_exists(posixpath.join(dest, TRIAL_JSON))
            self.fs.delete_dir(dest)
        if isinstance(self.fs, pafs.LocalFileSystem):
            self.fs.move(staging, dest)
        else:
            self._move_files(staging, dest)
        for old in [p for p, _ in self.complete_run_copies(trial_id)][KEEP_COPIES:]:
            self.fs.delete_dir(old)
        return dest

    def _move_files(self, src: str, dest: str) -> None:
        selector = pafs.FileSelector(src, recursive=True)
        files = [i.path for i in self.fs.get_file_info(selector)
                 if i.type == pafs.FileType.File]
        files.sort(key=lambda p: posixpath.basename(p) == TRIAL_JSON)  # trial.json last
        for path in files:
            self.fs.copy_file(path, posixpath.join(dest, posixpath.relpath(path, src)))
        self.fs.delete_dir(src)

    def _drop_staging(self, parent: str) -> None:
        """Uploads of an attempt killed mid-copy (one trial has one writer at a time)."""
        selector = pafs.FileSelector(parent, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.base_name.startswith(".") and info.base_name.endswith(".partial"):
                self.fs.delete_dir(info.path)

    def _delete_if_exists(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def download_run(self, path: str, run_dir: str) -> None:
        """The run copy at `path` as the local run folder (without its trial.json, which
        would otherwise mark the next copy complete before its files are in)."""
        os.makedirs(run_dir, exist_ok=True)
        pafs.copy_files(path, run_dir, source_filesystem=self.fs,
                        destination_filesystem=pafs.LocalFileSystem())
        os.remove(os.path.join(run_dir, TRIAL_JSON))


def _run_files(run_dir: str) -> list[str]:
    """Paths (relative) of the run folder's files, without temp debris and the run lock."""
    out = []
    for folder, _, names in os.walk(run_dir):
        for name in names:
            if not is_debris(name):
                out.append(os.path.relpath(os.path.join(folder, name), run_dir))
    return sorted(out)
