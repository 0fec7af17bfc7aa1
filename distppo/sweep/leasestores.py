"""The conditional writes of the sweep's lease object (sweep/objlease.py) on S3 and on GCS.

pyarrow's file systems write unconditionally, so each store talks to its storage's own API:
S3 through boto3 (`If-None-Match: *` / `If-Match: <ETag>`, since botocore 1.35), GCS through
its JSON API (`ifGenerationMatch`), with google-auth's credentials. Both are optional
dependencies, needed only by a sweep on that storage. Each read says how old the object is by
the storage's clock: its write time against the `Date` of the same response.
"""
from __future__ import annotations

import json
import os
import secrets
import urllib.parse
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Optional

from distppo.errors import UserError
from distppo.sweep.objlease import Seen, Taken, parse

# A call that hangs is a renewal that fails: the lease's watchdog ends the driver in time anyway.
TIMEOUT_S = 10.0


def _options(storage) -> dict:
    return dict(urllib.parse.parse_qsl(storage.storage.partition("?")[2]))


def _age(date_header: Optional[str], written: datetime) -> Optional[float]:
    """Seconds between the storage's write time and its `Date` (both the storage's clock)."""
    if not date_header:
        return None
    try:
        return (parsedate_to_datetime(date_header) - written).total_seconds()
    except (TypeError, ValueError):
        return None


class S3Store:
    PRECONDITION = ("PreconditionFailed", "412", "ConditionalRequestConflict", "NoSuchKey", "404")
    NO_SUCH_VERSION = '"ffffffffffffffffffffffffffffffff"'  # an ETag no write gets here

    def __init__(self, storage, path: str) -> None:
        try:  # S3 storage only; botocore has the conditional writes since 1.35
            import boto3
            from botocore.config import Config
            from botocore.exceptions import ClientError
        except ImportError:
            raise UserError("an s3:// storage needs boto3 for the sweep's lease: pip install "
                            "'boto3>=1.35' (in the train extra)") from None
        self._error = ClientError
        options = _options(storage)
        endpoint = options.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{options.get('scheme', 'https')}://{endpoint}"
        config = Config(connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S,
                        retries={"max_attempts": 2})
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name=options.get("region"),
                               config=config)
        self.bucket, _, self.key = path.partition("/")

    def _put(self, body: bytes, **condition) -> str:
        try:
            return self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=body,
                                      **condition)["ETag"]
        except self._error as exc:
            if exc.response.get("Error", {}).get("Code", "") in self.PRECONDITION:
                raise Taken() from None
            raise

    def create(self, body: bytes) -> str:
        return self._put(body, IfNoneMatch="*")

    def replace(self, version: str, body: bytes) -> str:
        return self._put(body, IfMatch=version)

    def read(self) -> Optional[Seen]:
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        except self._error as exc:
            if exc.response.get("Error", {}).get("Code", "") in ("NoSuchKey", "404"):
                return None
            raise
        date = got["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        return Seen(parse(got["Body"].read()), got["ETag"], _age(date, got["LastModified"]))

    def delete(self, version: str) -> None:
        """Only `version`: a lease another driver took in the meantime stays (S3's conditional
        DeleteObject); a version already replaced or gone is not an error."""
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
        except self._error as exc:
            if exc.response.get("Error", {}).get("Code", "") not in self.PRECONDITION:
                raise


class GcsStore:
    API = "https://storage.googleapis.com"
    NO_SUCH_VERSION = "1"  # generations are microsecond timestamps: never 1

    def __init__(self, storage, path: str) -> None:
        try:
            import requests
        except ImportError:
            raise UserError("a gs:// storage needs google-auth and requests for the sweep's "
                            "lease: pip install 'google-auth[requests]' (in the train extra)"
                            ) from None
        self._request_error = requests.RequestException
        options = _options(storage)
        endpoint = options.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{options.get('scheme', 'https')}://{endpoint}"
        # an emulator (STORAGE_EMULATOR_HOST, as Google's clients read it) takes no credentials
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
        self.session = requests.Session() if endpoint else self._authorized()
        self.base = (endpoint or self.API).rstrip("/")
        self.bucket, _, self.key = path.partition("/")
        self.url = (f"{self.base}/storage/v1/b/{self.bucket}/o/"
                    f"{urllib.parse.quote(self.key, safe='')}")

    @staticmethod
    def _authorized():
        """A session with the environment's Google credentials (GOOGLE_APPLICATION_CREDENTIALS,
        gcloud's, or the VM's service account), as pyarrow's GCS file system finds them."""
        try:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError
            from google.auth.transport.requests import AuthorizedSession
        except ImportError:
            raise UserError("a gs:// storage needs google-auth for the sweep's lease: pip "
                            "install 'google-auth[requests]' (in the train extra)") from None
        try:
            creds, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
        except DefaultCredentialsError as exc:
            raise UserError(f"gs:// storage: no Google credentials for the sweep's lease "
                            f"({str(exc).splitlines()[0]})") from None
        return AuthorizedSession(creds)

    def _upload(self, body: bytes, generation: str) -> str:
        boundary = secrets.token_hex(16)
        meta = json.dumps({"name": self.key, "contentType": "application/json"})
        data = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}"
                f"\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n").encode() + body \
            + f"\r\n--{boundary}--\r\n".encode()
        r = self.session.post(f"{self.base}/upload/storage/v1/b/{self.bucket}/o",
                              params={"uploadType": "multipart", "ifGenerationMatch": generation},
                              data=data, timeout=TIMEOUT_S,
                              headers={"Content-Type": f"multipart/related; boundary={boundary}"})
        if r.status_code == 412:
            raise Taken()
        r.raise_for_status()
        return str(r.json()["generation"])

    def create(self, body: bytes) -> str:
        return self._upload(body, "0")  # generation 0: only if no live object has this name

    def replace(self, version: str, body: bytes) -> str:
        return self._upload(body, version)

    def read(self) -> Optional[Seen]:
        meta = self.session.get(self.url, timeout=TIMEOUT_S)
        if meta.status_code == 404:
            return None
        meta.raise_for_status()
        info = meta.json()
        # timeCreated is per generation: each renewal is a new one
        written = datetime.fromisoformat(info["timeCreated"].replace("Z", "+00:00"))
        media = self.session.get(self.url, params={"alt": "media",
                                                   "generation": info["generation"]},
                                 timeout=TIMEOUT_S)
        if media.status_code == 404:  # replaced between the two reads
            return None
        media.raise_for_status()
        return Seen(parse(media.content), str(info["generation"]),
                    _age(meta.headers.get("Date"), written))

    def delete(self, version: str) -> None:
        r = self.session.delete(self.url, params={"ifGenerationMatch": version},
                                timeout=TIMEOUT_S)
        if r.status_code not in (404, 412):
            r.raise_for_status()
