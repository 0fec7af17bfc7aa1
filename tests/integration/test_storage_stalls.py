"""A bucket that stops answering mid-sweep: each later request ends in an error within a bound
(sweep/layout.py stalls_bounded), in this process and in the pickled copy Tune hands to every
trial, instead of holding the driver for minutes. A real moto S3 answers the first request,
then a loopback listener that accepts and never answers takes its port."""
from __future__ import annotations

import pickle
import socket
import time

import pytest

from distppo.sweep.layout import filesystem

STALL_S = 2.0
# Arrow's 3 attempts, each given up after STALL_S, plus the SDK's backoff between them
BOUND_S = 3 * STALL_S + 6


@pytest.mark.timeout(120)
def test_a_bucket_that_stops_answering_fails_each_request_within_the_bound(monkeypatch):
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    for name, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
                        "DISTPPO_STORAGE_TIMEOUT_S": str(STALL_S)}.items():
        monkeypatch.setenv(name, value)
    silent = socket.socket()
    try:
        fs, path = filesystem("s3://sweeps-bucket/s")  # answered: the bucket is not there
        server.stop()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind((host, port))
        silent.listen(64)  # connections complete in the kernel's backlog, and nothing answers
        for each in (fs, pickle.loads(pickle.dumps(fs))):
            start = time.monotonic()
            with pytest.raises(OSError, match="Timeout was reached"):
                each.get_file_info(path + "/trials.parquet")
            assert time.monotonic() - start < BOUND_S
    finally:
        silent.close()
