"""The faults a run survived, each recorded the moment it is counted, where no roll-back reaches.

A run's fault counters (`runner_restarts`, `learner_recoveries`; a sweep trial's `restarts`)
are cumulative over all its attempts. The rows and checkpoints that carry them can be rolled
back: a sweep trial restarts from its last run copy, a resumed run from its last checkpoint,
and counts kept only there would lose the faults after that point. So each counted fault is
also one small file in a folder that nothing rolls back, and an attempt starts its counters
from those files.

    <folder>/<kind>.<n>.<time_ns>.<pid>.<random>.json    {"kind", "n", "detail", "time"}

One file per fault because an object store cannot append; the count is in the name, so a
listing is enough and a file cut short by a kill still counts. Folders: `<run>/faults/` for a
run (core/runfolder.py), `<sweep>/faults/<trial_id>/` for a sweep trial (sweep/layout.py),
outside the run copies that a restarted trial rolls back to.
"""
from __future__ import annotations

import json
import os
import posixpath
import secrets
import sys
import time
from collections import Counter
from typing import Callable

import pyarrow.fs as pafs

# The counters a log holds, named as the Parquet columns (telemetry/schema.py) they feed.
KINDS = ("runner_restarts", "learner_recoveries", "trial_restarts", "trial_preemptions")
OnFault = Callable[[str, int, str], None]  # (kind, n, detail): FaultCounter, or a no-op


def ignore_fault(kind: str, n: int = 1, detail: str = "") -> None:
    """The on_fault of a backend used on its own (tests, bench): nothing is logged."""


class FaultLog:
    """Counted faults of one run (or sweep trial) in `folder` of a pyarrow file system."""

    def __init__(self, fs: pafs.FileSystem, folder: str) -> None:
        self.fs, self.folder = fs, folder

    @classmethod
    def local(cls, folder: str) -> "FaultLog":
        return cls(pafs.LocalFileSystem(), os.path.abspath(folder))

    def counts(self) -> Counter:
        """{kind: faults counted so far}, over every attempt that wrote here."""
        return self.tally()[0]

    def tally(self) -> tuple[Counter, dict]:
        """counts(), and {kind: time_ns of its newest fault}, from one listing."""
        selector = pafs.FileSelector(self.folder, allow_not_found=True)
        counts: Counter = Counter()
        newest: dict = {}
        for info in self.fs.get_file_info(selector):
            parts = info.base_name.split(".")
            if info.type == pafs.FileType.File and len(parts) == 6 and parts[0] in KINDS:
                counts[parts[0]] += int(parts[1])
                newest[parts[0]] = max(newest.get(parts[0], 0), int(parts[2]))
        return counts, newest

    def add(self, kind: str, n: int = 1, detail: str = "") -> None:
        """Record `n` faults of `kind` now (before the row that shows them is written)."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {KINDS}")
        if n <= 0:
            return
        name = f"{kind}.{n}.{time.time_ns()}.{os.getpid()}.{secrets.token_hex(3)}.json"
        self.fs.create_dir(self.folder, recursive=True)
        with self.fs.open_output_stream(posixpath.join(self.folder, name)) as f:
            f.write(json.dumps({"kind": kind, "n": n, "detail": detail,
                                "time": time.time()}).encode())


class FaultCounter:
    """What a backend and the loop call the moment they count a fault: `counter(kind, n,
    detail)` logs it and adds it to `new`, the faults this process counted. A log that cannot
    be written is one line; the run goes on and its rows still count the fault."""

    def __init__(self, log: FaultLog) -> None:
        self.log, self.new = log, Counter()

    def __call__(self, kind: str, n: int = 1, detail: str = "") -> None:
        if n <= 0:
            return
        self.new[kind] += n
        try:
            self.log.add(kind, n, detail)
        except OSError as exc:
            print(f"distppo: {n} {kind} not written to the fault log {self.log.folder} "
                  f"({type(exc).__name__}: {exc}); the rows count it", file=sys.stderr,
                  flush=True)
