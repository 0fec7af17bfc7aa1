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

    def __init__(self, storage: str, name: str, answer_s: Optional[float] = None) -> None:
        self.storage = absolute(storage)
        self.name = name
        self.fs, root = filesystem(self.storage, answer_s=answer_s)
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

    def tune_location(self) -> tuple[str, Optional[pafs.FileSystem]]:
        """(sweep folder, file system) as Tune is to reach it: a local folder as it is; on an
        object store the path inside this storage's own file system, so Tune's state goes
        where the run copies go, the same way (an emulator, the bounded retries:
        layout.arrow_uri), not by Tune's own resolution of the URI."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return self.location, None
        return self.path, self.fs

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
    def _copy_folders(self, trial_id: str) -> dict[str, set[str]]:
        """{folder name: its files, relative} under runs/<trial_id>, from what is really there.

        One recursive listing, read for the files themselves: an object store lists a folder
        one level deep only where a marker object names it (Arrow's GCS listing returns
        nothing else), and a copy committed file by file has none. Folders a listing does
        show (local, markers) are kept with no files, so an empty staging folder is found."""
        root = self.join(RUNS, trial_id)
        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        folders: dict[str, set[str]] = {}
        for info in self.fs.get_file_info(selector):
            folder, _, rel = posixpath.relpath(info.path, root).partition("/")
            files = folders.setdefault(folder, set())
            if rel and info.type == pafs.FileType.File:
                files.add(rel)
        return folders

    def run_copies(self, trial_id: str) -> list[str]:
        """Paths of the trial's run copies that hold their trial.json, newest (highest
        iteration) first; a hidden name is an upload in progress (or a killed one's debris),
        never a copy."""
        names = [name for name, files in self._copy_folders(trial_id).items()
                 if not name.startswith(".") and TRIAL_JSON in files]
        return [self.join(RUNS, trial_id, name) for name in sorted(names, reverse=True)]

    def complete_run_copies(self, trial_id: str) -> Iterator[tuple[str, dict]]:
        """(path, trial.json) of each complete run copy, newest first."""
        for path in self.run_copies(trial_id):
            try:
                with self.fs.open_input_stream(posixpath.join(path, TRIAL_JSON)) as f:
                    yield path, json.loads(f.readall())
            except (OSError, ValueError):  # gone since the listing, or a half-written one
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
        but the newest KEEP_COPIES complete copies are dropped, with any older folder left
        without its trial.json by a writer killed mid-move.

        `fence` (lease.Fence): checked before the upload starts and again just before the copy
        takes its name, so a driver that lost its lease meanwhile adds no copy (LeaseLost).
        """
        parent = self.join(RUNS, trial_id)
        dest = posixpath.join(parent, f"{iteration:06d}")
        staging = posixpath.join(parent, f".{iteration:06d}.{secrets.token_hex(4)}.partial")
        if fence is not None:
            fence.check(self)
        self._drop_staging(trial_id)
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
                self.remove(staging)
                raise
        if self._exists_path(dest):
            self._delete_if_exists(posixpath.join(dest, TRIAL_JSON))
            self.remove(dest)
        if isinstance(self.fs, pafs.LocalFileSystem):
            self.fs.move(staging, dest)
        else:
            self._move_files(staging, dest)
        self._prune(trial_id)
        return dest

    def _prune(self, trial_id: str) -> None:
        """Keep the newest KEEP_COPIES complete copies; drop older copies and older folders
        without a trial.json (a move killed midway). Newer ones of the latter are left for the
        upload of that iteration to replace."""
        kept = [p for p, _ in self.complete_run_copies(trial_id)][:KEEP_COPIES]
        newest = posixpath.basename(kept[0]) if kept else ""
        for name in self._copy_folders(trial_id):
            path = self.join(RUNS, trial_id, name)
            if not name.startswith(".") and path not in kept and name < newest:
                self.remove(path)

    def _move_files(self, src: str, dest: str) -> None:
        selector = pafs.FileSelector(src, recursive=True)
        files = [i.path for i in self.fs.get_file_info(selector)
                 if i.type == pafs.FileType.File]
        files.sort(key=lambda p: posixpath.basename(p) == TRIAL_JSON)  # trial.json last
        for path in files:
            self.fs.copy_file(path, posixpath.join(dest, posixpath.relpath(path, src)))
        self.remove(src)

    def _drop_staging(self, trial_id: str) -> None:
        """Uploads of an attempt killed mid-copy (one trial has one writer at a time)."""
        for name in self._copy_folders(trial_id):
            if name.startswith(".") and name.endswith(".partial"):
                self.remove(self.join(RUNS, trial_id, name))

    def remove(self, path: str) -> None:
        """A folder and all in it, on any store. On an object store a folder is its objects'
        common prefix (plus a marker object where one was written): one whose files were
        written one by one has no marker, and Arrow's GCS delete_dir, having deleted the
        files, then fails on it. What is not there is not an error."""
        self.fs.delete_dir_contents(path, missing_dir_ok=True)
        if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
            self.fs.delete_dir(path)

    def _delete_if_exists(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def download_run(self, path: str, run_dir: str) -> None:
        """The run copy at `path` as the local run folder, without its trial.json (which
        would otherwise mark the next copy complete before its files are in). File by file
        from a recursive listing: a copy on GCS has no folder objects for a tree copy to
        recreate its subfolders from."""
        os.makedirs(run_dir, exist_ok=True)
        selector = pafs.FileSelector(path, recursive=True)
        for info in self.fs.get_file_info(selector):
            rel = posixpath.relpath(info.path, path)
            if info.type != pafs.FileType.File or rel == TRIAL_JSON:
                continue
            local = os.path.join(run_dir, *rel.split("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with self.fs.open_input_stream(info.path) as src, open(local, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)


def _run_files(run_dir: str) -> list[str]:
    """Paths (relative) of the run folder's files, without temp debris and the run lock."""
    out = []
    for folder, _, names in os.walk(run_dir):
        for name in names:
            if not is_debris(name):
                out.append(os.path.relpath(os.path.join(folder, name), run_dir))
    return sorted(out)
