"""The chaos soak's storage (launch/chaos_soak.py): a local folder, or a bucket on a loopback
emulator that the soak starts itself, and every read of the audit through distppo's own opener.

    s3://  moto's server, the credentials and AWS_ENDPOINT_URL a driver and its trials need;
    gs://  fake-gcs-server and STORAGE_EMULATOR_HOST;
both started as the suite's fixtures start them (distppo/testing/emulators.py).

An emulator is started only where the environment points at none (AWS_ENDPOINT_URL /
STORAGE_EMULATOR_HOST unset): then the user's endpoint is used, and the bucket is made if
missing.
"""
from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distppo.sweep.layout import (
    ITERATIONS_FILE,
    RUNS,
    TRIAL_JSON,
    TRIALS_FILE,
    filesystem,
    read_object,
)
from distppo.testing.emulators import (
    ENDPOINT_VARIABLE,
    make_bucket,
    s3_credentials,
    start_emulator,
)

# Distinctive credentials (moto takes any), so a leak into a stored file is easy to find.
S3_CREDENTIALS = s3_credentials("AKIDDISTPPOSOAK", "distppo-soak")


class SoakStore:
    """The sweep `<storage>/<name>` as the audit reads it: through distppo's opener
    (sweep/layout.py filesystem), whatever the storage."""

    def __init__(self, storage: str, name: str, env: dict) -> None:
        self.storage, self.name, self.env = storage, name, env
        self.scheme = storage.partition("://")[0] if "://" in storage else ""
        self.stop: Optional[Callable[[], None]] = None
        self._fs: Optional[pafs.FileSystem] = None

    def start(self) -> dict:
        """Start an emulator where one is needed and none is given, make the bucket; the
        variables the drivers need."""
        if self.scheme not in ENDPOINT_VARIABLE:
            return {}
        given = {k: v for k, v in self.env.items() if k in ENDPOINT_VARIABLE.values()
                 or k.startswith("AWS_")}
        if self.env.get(ENDPOINT_VARIABLE[self.scheme]):
            extra = given
        else:
            self.stop, extra = start_emulator(self.scheme, S3_CREDENTIALS)
        make_bucket(self.scheme, urllib.parse.urlsplit(self.storage).netloc, dict(given, **extra))
        os.environ.update(extra)  # the audit's own reads go there too
        return extra

    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs, self.root = filesystem(posixpath.join(self.storage, self.name))
        return self._fs

    def table(self, file: str, columns: Optional[list] = None):
        def decode(body: bytes):
            return pq.read_table(pa.BufferReader(body), columns=columns)
        # read whole, as the product's readers do: the driver replaces it in place
        return read_object(self.fs, posixpath.join(self._root(), file), decode)

    def _root(self) -> str:
        self.fs  # noqa: B018 - opens it and sets root
        return self.root

    def iterations(self, columns: Optional[list] = None):
        return self.table(ITERATIONS_FILE, columns)

    def trials(self):
        return self.table(TRIALS_FILE)

    def _files(self, under: str) -> list:
        """Every file under `under` (a recursive listing: GCS lists no folder without a
        marker object one level deep)."""
        selector = pafs.FileSelector(under, recursive=True, allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def read(self, path: str) -> str:
        with self.fs.open_input_stream(path) as f:
            return f.readall().decode(errors="replace")

    def error_texts(self) -> list[str]:
        """Tune's error.txt of each trial folder (<trial_id>/error.txt)."""
        root = self._root()
        return [self.read(i.path) for i in self._files(root)
                if posixpath.relpath(i.path, root).count("/") == 1
                and i.base_name == "error.txt"]

    def copies(self) -> list[tuple[str, int, list]]:
        """(trial id, iteration, resumed_from) of every complete run copy now in the storage
        (complete: its trial.json, written last, is there)."""
        runs = posixpath.join(self._root(), RUNS)
        found = []
        for info in self._files(runs):
            parts = posixpath.relpath(info.path, runs).split("/")
            if len(parts) != 3 or parts[2] != TRIAL_JSON or not parts[1].isdigit():
                continue
            try:
                record = json.loads(self.read(info.path))
            except (OSError, ValueError):  # pruned between the listing and the read
                continue
            found.append((parts[0], int(parts[1]), list(record.get("resumed_from", []))))
        return found
