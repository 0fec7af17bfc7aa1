"""One driver per sweep: a lease on <sweep>/.sweep.lease, taken before Ray or Tune start.

Two drivers on one sweep (a second `distppo sweep ... --resume`, or a launch script that adds
--resume on its own submitted twice) would both restore the experiment and run the same trials
into the same storage (issue 14). So:

- Local folder: an exclusive flock on the lease file. The kernel drops it when its holder dies,
  SIGKILL included, so a killed driver never blocks its --resume; the descriptor is not
  inherited by child processes (Python opens files non-inheritable, PEP 446).
- S3: an object created only if absent (PUT If-None-Match: *), holding an expiry that the
  running driver renews every LEASE_TTL_S / 3 (PUT If-Match: its ETag). A driver killed without
  a chance to delete it blocks others until the expiry passes; `--force-unlock` takes it at once.
- Any other URI scheme (gs://, ...), or a folder whose file system has no locks (an NFS
  mounted `nolock` answers flock with ENOLCK): no lease, said in one line.

The refusal is one line naming the holder and what to do.

`held()` tells readers (`distppo status`) whether a driver holds the lease now, without taking
it: a driver that ended or was killed is seen at once (S3: a killed one within LEASE_TTL_S)
instead of after minutes without writes.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from typing import Optional

from distppo.errors import UserError
from distppo.sweep.layout import first_line

LEASE_NAME = ".sweep.lease"
LEASE_TTL_S = float(os.environ.get("DISTPPO_LEASE_TTL_S", "60"))
# A reader's probe holds a shared lock for microseconds; a driver starting in that instant
# tries again rather than refuse.
ACQUIRE_TRIES, ACQUIRE_RETRY_S = 10, 0.1


def _holder() -> dict:
    return {"owner": uuid.uuid4().hex, "pid": os.getpid(), "host": socket.gethostname(),
            "since": time.time()}


def _refusal(uri: str, holder: dict) -> UserError:
    who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    return UserError(f"sweep {uri} is being run by another driver ({who}): wait for it or stop "
                     "it; if it is dead, add --force-unlock")


class NoLocks(OSError):
    """flock is not available on the lease file's file system (ENOLCK, ENOSYS, EOPNOTSUPP)."""


def acquire(storage, force: bool = False):
    """The sweep's lease (LocalLease, S3Lease, or None where there is none: said in one line),
    or UserError."""
    scheme = storage.storage.split("://", 1)[0] if "://" in storage.storage else "file"
    if scheme == "file":
        try:
            return LocalLease(storage.join(LEASE_NAME), storage.uri, force)
        except NoLocks as exc:
            return _no_lease(f": this file system has no file locks ({exc.strerror})",
                             storage.uri)
    if scheme == "s3":
        return S3Lease(storage, force)
    return _no_lease(f" on {scheme}:// storage", storage.uri)


def _no_lease(why: str, uri: str) -> None:
    """The one line of a sweep that runs without a lease; None, the lease it has."""
    print(f"distppo: no sweep lease{why}: do not run two drivers on {uri}", file=sys.stderr)


def _lock_exclusive(fd: int) -> bool:
    """flock(LOCK_EX) without blocking, tried ACQUIRE_TRIES times: False while another holds it."""
    for attempt in range(ACQUIRE_TRIES):
        if attempt:
            time.sleep(ACQUIRE_RETRY_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                raise NoLocks(exc.errno, exc.strerror) from None
            raise
    return False


class LocalLease:
    def __init__(self, path: str, uri: str, force: bool) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if force:  # a holder we cannot see (another host on a shared file system) loses it
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = _lock_exclusive(self.fd)
        except OSError:
            os.close(self.fd)
            raise
        if not locked:
            holder = _parse(os.pread(self.fd, 4096, 0))
            os.close(self.fd)
            raise _refusal(uri, holder)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(_holder()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            try:  # emptied while still locked: a released lease names no holder (`held`)
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # the file stays: removing it would race a second locker
            self.fd = -1


class S3Lease:
    """A conditional-create lease object with an expiry, renewed by a daemon thread."""

    def __init__(self, storage, force: bool) -> None:
        try:  # S3 storage only; botocore has the conditional writes since 1.35
            import boto3
            from botocore.exceptions import ClientError
        except ImportError:
            raise UserError("an s3:// storage needs boto3 for the sweep's lease: pip install "
                            "'boto3>=1.35' (in the train extra)") from None
        self._error = ClientError
        base, _, query = storage.storage.partition("?")
        options = dict(urllib.parse.parse_qsl(query))
        endpoint = options.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{options.get('scheme', 'https')}://{endpoint}"
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name=options.get("region"))
        self.bucket, _, key = storage.join(LEASE_NAME).partition("/")
        self.key, self.uri, self.etag = key, storage.uri, None
        self.holder = _holder()
        self._take(force)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="sweep-lease", daemon=True)
        self._thread.start()

    def _put(self, **condition) -> str:
        body = json.dumps(dict(self.holder, expires=time.time() + LEASE_TTL_S)).encode()
        return self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=body,
                                  **condition)["ETag"]

    def _code(self, exc) -> str:
        return exc.response.get("Error", {}).get("Code", "")

    def _take(self, force: bool) -> None:
        try:
            self.etag = self._put(IfNoneMatch="*")
            return
        except self._error as exc:
            if self._code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise UserError(f"sweep lease {self.uri}/{LEASE_NAME}: {first_line(exc)}") from None
        got = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        holder = _parse(got["Body"].read())
        if not force and holder.get("expires", 0) > time.time():
            raise _refusal(self.uri, holder)
        try:  # expired or forced: take it over, unless another driver did so first
            self.etag = self._put(IfMatch=got["ETag"])
        except self._error:
            raise _refusal(self.uri, holder) from None

    def _renew_loop(self) -> None:
        while not self._stop.wait(LEASE_TTL_S / 3):
            try:
                self.etag = self._put(IfMatch=self.etag)
            except self._error as exc:
                if self._code(exc) in ("PreconditionFailed", "412"):
                    print(f"distppo: sweep lease {self.uri} was taken by another driver "
                          "(--force-unlock): stop this one", file=sys.stderr, flush=True)
                    return
                print(f"distppo: sweep lease renewal failed, retrying: {exc}", file=sys.stderr,
                      flush=True)
            except Exception as exc:  # a network blip: the next renewal may work
                print(f"distppo: sweep lease renewal failed, retrying: {exc}", file=sys.stderr,
                      flush=True)

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            got = self.s3.head_object(Bucket=self.bucket, Key=self.key)
            if got["ETag"] == self.etag:
                self.s3.delete_object(Bucket=self.bucket, Key=self.key)
        except self._error:
            pass


def held(fs, root: str, now: Optional[float] = None) -> Optional[bool]:
    """Whether a driver holds the lease of the sweep in `root` now: True or False, or None when
    this storage cannot tell (a local folder without a lease file, or whose free lease names
    another host, a scheme without a lease, an unreadable lease).

    Local: a shared flock tried without waiting and dropped at once; it writes nothing. A lock
    is seen from another host only where the file system shares flocks (NFSv4, not an NFS
    mounted `nolock` or Lustre's `localflock`), so a free lease that still names another host
    (a clean release empties it) cannot tell. S3: the lease object is there with its expiry
    ahead: a driver deletes it when it ends, a killed one stops renewing it (seen within
    LEASE_TTL_S)."""
    path = f"{root.rstrip('/')}/{LEASE_NAME}"
    kind = getattr(fs, "type_name", "")
    if kind == "local":
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            holder = _parse(os.pread(fd, 4096, 0))
            if holder.get("host", socket.gethostname()) != socket.gethostname():
                return None
            return False
        except OSError:
            return None
        finally:
            os.close(fd)
    if kind == "s3":
        try:
            with fs.open_input_stream(path) as f:
                holder = _parse(f.readall())
        except FileNotFoundError:
            return False
        except OSError:
            return None
        try:
            return float(holder.get("expires", 0)) > (time.time() if now is None else now)
        except (TypeError, ValueError):
            return None
    return None


def _parse(body: bytes) -> dict:
    """A lease file's holder; {} when it is empty (released) or not a JSON object."""
    try:
        holder = json.loads(body or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def release(lease: Optional[object]) -> None:
    if lease is not None:
        lease.release()
