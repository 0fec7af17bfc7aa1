"""Run files that a crash, a SIGKILL, a full disk or a second writer never leave half-written.

- `atomic_write`: the bytes go to a temp file beside the target whose name no other writer
  uses (pid + random), which is fsynced, renamed over the target, and the folder fsynced. The
  rename alone is atomic only in the page cache: without the fsyncs a power cut can leave an
  empty target (the ext4 "zero-length file" case) or lose the rename.
- Any OSError (no space, quota, read-only, I/O error) removes the temp file and becomes one
  `StorageError` line; the target keeps its old content.
- `clean_debris`: temp files of writers killed mid-write, removed under the run lock.
- `RunLock`: one process writes a run folder at a time.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import os
import secrets
from typing import Callable, Iterator, Union

from distppo.errors import StorageError, UserError
from distppo.testing import faults

TMP_SUFFIX = ".distppo-tmp"
# Fixed temp names that run folders of older versions may still hold after a killed write.
LEGACY_DEBRIS = ("ckpt_*.pt.tmp", "config.json.tmp", ".metrics.parquet.*.tmp")
LOCK_NAME = ".distppo.lock"
# What flock raises on a file system that has no locks (as opposed to a lock that is taken).
NO_LOCK_ERRNOS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)

Writer = Callable[[str], None]  # writes the whole file at the path it is given


def temp_path(path: str) -> str:
    """A hidden name beside `path` (same file system, so the rename is atomic) that globs such
    as ckpt_*.pt and Parquet dataset readers skip."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def atomic_write(path: str, data: Union[bytes, Writer]) -> None:
    """Replace `path` with `data` (bytes, or a function that writes a file at a given path)."""
    path = os.fspath(path)
    tmp = temp_path(path)
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
        faults.check_disk(path)
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except OSError as exc:
        remove_quietly(tmp)
        raise storage_error(path, exc) from None
    except BaseException:
        remove_quietly(tmp)
        raise


def storage_error(path: str, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    return StorageError(f"cannot write {path}: {reason}; the files written before it are whole")


@contextlib.contextmanager
def storage_errors(where: str) -> Iterator[None]:
    """An OSError of a writer we do not own (TensorBoard's) as one StorageError line."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        raise storage_error(exc.filename or where, exc) from None


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: str) -> None:
    """Make renames and deletions in `folder` durable (a no-op where the FS cannot)."""
    try:
        fsync_path(folder)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EACCES, errno.EISDIR):
            raise


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def is_debris(name: str) -> bool:
    """A killed writer's temp file, or the run lock: never part of a copy of the run."""
    return (name.endswith(TMP_SUFFIX) or name == LOCK_NAME
            or any(fnmatch.fnmatch(name, p) for p in LEGACY_DEBRIS))


def clean_debris(folder: str) -> list[str]:
    """Remove temp files that killed writers left in `folder`; returns their names. Call it
    only while holding the folder's RunLock, so no live writer owns them."""
    if not os.path.isdir(folder):
        return []
    removed = []
    for name in os.listdir(folder):
        if name != LOCK_NAME and is_debris(name):
            remove_quietly(os.path.join(folder, name))
            removed.append(name)
    return removed


class RunLock:
    """An exclusive flock on <run dir>/.distppo.lock for as long as a run writes the folder.

    The kernel drops the lock when its holder dies, SIGKILL included, so a stale lock never
    blocks a --resume; the descriptor is not inherited by child processes (Ray's daemons),
    which would otherwise keep it alive after the driver.
    """

    def __init__(self, run_dir: str) -> None:
        self.fd = os.open(os.path.join(run_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            raise UserError(f"run folder {run_dir} is in use by another distppo process "
                            f"(pid {holder}): let it finish or stop it first") from None
        except OSError as exc:
            # An NFS mounted `nolock` answers ENOLCK, some FUSE and network file systems
            # EOPNOTSUPP or ENOSYS: without the lock two writers could share the folder.
            os.close(self.fd)
            if exc.errno not in NO_LOCK_ERRNOS:
                raise
            raise UserError(f"run folder {run_dir} cannot be locked ({exc.strerror}): this file "
                            "system has no file locks; use an --output-dir on a local disk or "
                            "one mounted with locks") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = -1
