"""How a storage URI is opened (sweep/layout.py arrow_uri): gs:// follows STORAGE_EMULATOR_HOST
as Google's own clients do, with a bounded retry time; other schemes are left to Arrow."""
from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from distppo.sweep.layout import GCS_RETRY_LIMIT_S, arrow_uri


@pytest.mark.parametrize("emulator,endpoint,scheme", [
    ("http://127.0.0.1:4443", "127.0.0.1:4443", "http"),
    ("http://127.0.0.1:4443/", "127.0.0.1:4443", "http"),
    ("localhost:9023", "localhost:9023", "http"),  # Google's clients take a bare host:port too
    ("https://gcs.internal:443", "gcs.internal:443", "https"),
])
def test_gs_follows_storage_emulator_host(monkeypatch, emulator, endpoint, scheme):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    for given in ("gs://bkt/sweeps", "gcs://bkt/sweeps"):
        uri = arrow_uri(given)
        assert uri == (f"{given.split(':')[0]}://anonymous@bkt/sweeps?endpoint_override="
                       f"{endpoint.replace(':', '%3A')}&scheme={scheme}"
                       f"&retry_limit_seconds={GCS_RETRY_LIMIT_S}")
        fs, path = pafs.FileSystem.from_uri(uri)  # Arrow takes every part of it
        assert isinstance(fs, pafs.GcsFileSystem) and path == "bkt/sweeps"


def test_gs_without_emulator_keeps_its_own_endpoint_and_retry(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert arrow_uri("gs://bkt/s") == f"gs://bkt/s?retry_limit_seconds={GCS_RETRY_LIMIT_S}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    named = "gs://bkt/s?endpoint_override=gcs.example%3A8443&retry_limit_seconds=5"
    assert arrow_uri(named) == named  # the URI's own endpoint and retry time win


def test_other_schemes_are_arrows(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    for uri in ("s3://bkt/s?endpoint_override=x%3A1", "/abs/folder", "file:///abs/folder"):
        assert arrow_uri(uri) == uri
