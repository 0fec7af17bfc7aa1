"""One driver per sweep: a lease on <sweep>/.sweep.lease, taken before Ray or Tune start.

Two drivers on one sweep (a second `distppo sweep ... --resume`, or a launch script that adds
--resume on its own submitted twice) would both restore the experiment and run the same trials
into the same storage. So:

- Local folder: an exclusive flock on the lease file. The kernel drops it when its holder dies,
  SIGKILL included, so a killed driver never blocks its --resume; the descriptor is not
  inherited by child processes (Python opens files non-inheritable, PEP 446). A live holder's
  lock is never taken, --force-unlock or not: the file is never deleted (a new file beside
  the locked one would make two holders). Where flock is local to one node (Lustre mounted
  `localflock`, an NFS mounted `nolock` or `local_lock=flock|all`), a line says so.
- S3 and GCS: an object written only by conditional writes, with a ttl, renewed by the driver;
  a driver that cannot keep it stops (sweep/objlease.py).
- Any other URI scheme, or a folder whose file system has no locks (ENOLCK, EOPNOTSUPP,
  ENOSYS): no lease, said in one line.

The refusal is one line naming the holder and what to do. Each take writes a new `owner`
token, the lease's generation: `Fence` lets a trial check it before it commits a run copy, so
the trials of a driver that lost its lease add none.

`held()` tells readers (`distppo status`) whether a driver holds the lease now, without taking
it: a driver that ended or was killed is seen at once (S3, GCS: a killed one within its ttl)
instead of after minutes without writes.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

from distppo.errors import UserError
from distppo.sweep.layout import first_line, json_object, read_object
from distppo.sweep.objlease import ObjectLease, check_conditions, parse, ttl_of
from distppo.telemetry.files import NO_LOCK_ERRNOS

LEASE_NAME = ".sweep.lease"
LEASE_TTL_S = float(os.environ.get("DISTPPO_LEASE_TTL_S", "60"))
# A reader's probe holds a shared lock for microseconds; a driver starting in that instant
# tries again rather than refuse.
ACQUIRE_TRIES, ACQUIRE_RETRY_S = 10, 0.1
MOUNTS = "/proc/self/mounts"


def _holder() -> dict:
    return {"owner": os.urandom(16).hex(), "pid": os.getpid(), "host": socket.gethostname(),
            "since": time.time()}


def _refusal(uri: str, holder: dict) -> UserError:
    who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    return UserError(f"sweep {uri} is being run by another driver ({who}): wait for it or stop "
                     "it; if it is dead, add --force-unlock")


class NoLocks(OSError):
    """flock is not available on the lease file's file system (ENOLCK, ENOSYS, EOPNOTSUPP)."""


def acquire(storage, force: bool = False, on_lost: Optional[Callable[[str], None]] = None):
    """The sweep's lease (LocalLease, ObjectLease, or None where there is none: said in one
    line), or UserError. `on_lost`: what a driver whose object lease cannot be kept does
    (default: one line and exit objlease.EXIT_LEASE_LOST)."""
    scheme = storage.storage.split("://", 1)[0] if "://" in storage.storage else "file"
    if scheme == "file":
        try:
            return LocalLease(storage.join(LEASE_NAME), storage.uri, force)
        except NoLocks as exc:
            return _no_lease(f": this file system has no file locks ({exc.strerror})",
                             storage.uri)
    if scheme in ("s3", "gs", "gcs"):  # pyarrow reads gcs:// as gs://
        from distppo.sweep.leasestores import GcsStore, S3Store
        kind = S3Store if scheme == "s3" else GcsStore
        store = kind(storage, storage.join(LEASE_NAME))
        try:
            check_conditions(kind(storage, storage.join(f"{LEASE_NAME}.probe-{uuid.uuid4().hex}")),
                             storage.uri)
            return ObjectLease(store, storage.uri, _holder(), LEASE_TTL_S, force,
                               lambda holder: _refusal(storage.uri, holder), on_lost)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - the storage's own error, in one line
            raise UserError(f"sweep lease {storage.uri}/{LEASE_NAME}: {first_line(exc)}") \
                from None
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
            if exc.errno in NO_LOCK_ERRNOS:
                raise NoLocks(exc.errno, exc.strerror) from None
            raise
    return False


def node_local_flock(path: str, mounts: Optional[str] = None) -> Optional[str]:
    """Why flock on `path` is seen by this node only (its mount's type and option), or None
    where its mount does not say so (or /proc/self/mounts cannot be read)."""
    try:
        with open(mounts or MOUNTS) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real, best = os.path.realpath(path), None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, fields[2], fields[3].split(","))
    if best is None:
        return None
    point, kind, options = best
    if kind == "lustre" and "localflock" in options:
        return f"{point} is Lustre mounted localflock"
    if kind.startswith("nfs"):
        local = [o for o in options if o in ("nolock", "local_lock=flock", "local_lock=all")]
        if local:
            return f"{point} is NFS mounted {local[0]}"
    return None


class LocalLease:
    def __init__(self, path: str, uri: str, force: bool) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Never removed, --force-unlock or not: a live holder keeps its lock on the file it
        # opened, and a new file in its place would be a second lease.
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = _lock_exclusive(self.fd)
        except OSError:
            os.close(self.fd)
            raise
        if not locked:
            holder = parse(os.pread(self.fd, 4096, 0))
            os.close(self.fd)
            if force:  # the kernel (or the NFS server) drops a dead holder's lock on its own
                who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
                raise UserError(f"sweep {uri}: --force-unlock cannot take a lock that a live "
                                f"driver holds ({who}): stop it first")
            raise _refusal(uri, holder)
        self.holder = _holder()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(self.holder).encode(), 0)
        local = node_local_flock(path)
        if local:
            print(f"distppo: sweep lease on {uri} holds on this node only ({local}): a driver on "
                  "another node would not see it; run one driver at a time", file=sys.stderr)

    @property
    def token(self) -> str:
        return self.holder["owner"]

    def release(self) -> None:
        if self.fd >= 0:
            try:  # emptied while still locked: a released lease names no holder (`held`)
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # the file stays: removing it would race a second locker
            self.fd = -1


class LeaseLost(UserError):
    """A trial's run copy refused: its driver's lease is not the current one."""


@dataclass(frozen=True)
class Fence:
    """The lease generation a driver's trials write under (picklable: it travels to trials)."""
    token: str

    def check(self, storage) -> None:
        """LeaseLost unless the sweep's lease is still the one of this generation."""
        try:  # read whole: a renewal may replace the object under an Arrow S3 read
            holder = read_object(storage.fs, storage.join(LEASE_NAME), json_object)
        except (FileNotFoundError, ValueError):  # gone, or never one holder's whole body
            holder = {}
        if holder.get("owner") != self.token:
            raise LeaseLost(f"sweep {storage.uri}: its lease is no longer this trial's driver's "
                            "(another driver took it, or this one ended): run copy not written")


def fence(lease) -> Optional[Fence]:
    """The Fence of a lease; None for a sweep without one."""
    return Fence(lease.token) if lease is not None else None


def held(fs, root: str, now: Optional[float] = None) -> Optional[bool]:
    """Whether a driver holds the lease of the sweep in `root` now: True or False, or None when
    this storage cannot tell (a local folder without a lease file, or whose free lease names
    another host, a scheme without a lease, an unreadable lease).

    Local: a shared flock tried without waiting and dropped at once; it writes nothing. A lock
    is seen from another host only where the file system shares flocks (NFSv4, not an NFS
    mounted `nolock` or Lustre's `localflock`), so a free lease that still names another host
    (a clean release empties it) cannot tell. S3, GCS: the lease object is there, written
    within its ttl: a driver deletes it when it ends, a killed one stops renewing it (seen
    within the ttl). The object's write time is the storage's clock, `now` this host's: a
    reader's view only, never what decides who may take the lease (objlease.py)."""
    path = f"{root.rstrip('/')}/{LEASE_NAME}"
    kind = getattr(fs, "type_name", "")
    if kind == "local":
        return _held_locally(path)
    if kind in ("s3", "gcs"):
        try:
            info = fs.get_file_info(path)
            if not info.is_file:
                return False
            holder = read_object(fs, path, json_object)
        except FileNotFoundError:
            return False
        except ValueError:  # not an object lease
            holder = {}
        except OSError:
            return None
        ttl = ttl_of(holder, LEASE_TTL_S)
        if ttl == 0:  # no object lease (an empty body, a local lease file copied here)
            return False
        if ttl is None or info.mtime is None:
            return None
        return info.mtime.timestamp() + ttl > (time.time() if now is None else now)
    return None


def _held_locally(path: str) -> Optional[bool]:
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
        holder = parse(os.pread(fd, 4096, 0))
        if holder.get("host", socket.gethostname()) != socket.gethostname():
            return None
        return False
    except OSError:
        return None
    finally:
        os.close(fd)


def release(lease: Optional[object]) -> None:
    if lease is not None:
        lease.release()
