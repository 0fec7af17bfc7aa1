"""The sweep's lease on an object store (S3, GCS): an object written only by conditional writes.

- Taken by creating it only if absent (S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`), or by
  replacing an expired or --force-unlock'ed one only if it is still the version read
  (S3 `If-Match: <ETag>`, GCS `ifGenerationMatch=<generation>`): of two drivers, one wins.
- Renewed every ttl / 3 the same way. A renewal that finds another version there (the lease was
  taken) ends the driver at once; renewals that keep failing for another reason (the storage
  unreachable) end it before its lease can expire. Either way one line and EXIT_LEASE_LOST,
  without Tune saving its state: the storage is another driver's now.
- Expiry is never one host's clock against another's. The holder keeps its own deadline on its
  monotonic clock, from the moment it sent its last renewal that succeeded; a contender asks
  the storage how old the object is (its write time against the storage's own `Date`), and
  takes it only when that age exceeds the lease's ttl by more than the timestamps' grain. The
  holder stops at ttl - ttl/6 after its send, and the storage stamps the object after that
  send, so the holder is gone before any contender sees the lease expired.
- Every take writes a new `owner` token: the lease's generation, which the trials' uploads
  check before they commit a run copy (lease.Fence), so a demoted driver's trials cannot add
  copies.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from distppo.errors import UserError
from distppo.sweep.layout import first_line

EXIT_LEASE_LOST = 4
# The storages' timestamps have a resolution of one second (S3's Last-Modified, HTTP Date).
CLOCK_GRAIN_S = 1.0


class Taken(Exception):
    """A conditional write lost: the lease object is not the version it was conditioned on."""


@dataclass
class Seen:
    """The lease object as read: its holder, its version (ETag / generation), and its age by
    the storage's clock (None where the storage did not say)."""
    holder: dict
    version: str
    age_s: Optional[float]


def parse(body: bytes) -> dict:
    """A lease's holder; {} when it is empty (released) or not a JSON object."""
    try:
        holder = json.loads(body or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def ttl_of(holder: dict, default: float) -> Optional[float]:
    """The lease's own ttl (each holder writes the one it renews against); the reader's
    default for an object lease of a distppo that wrote only its expiry; 0 for a body that is
    no object lease (empty, or a local lease file copied to the bucket): it holds nothing;
    None for a ttl that is not a number."""
    if "ttl_s" not in holder:
        return default if "expires" in holder else 0.0
    ttl = holder["ttl_s"]
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        return None
    return float(ttl)


def expired(seen: Seen, default_ttl: float) -> bool:
    ttl = ttl_of(seen.holder, default_ttl)
    if ttl == 0:  # no object lease at all
        return True
    return seen.age_s is not None and ttl is not None and seen.age_s > ttl + CLOCK_GRAIN_S


def exit_lost(line: str) -> None:
    """The default end of a driver that lost its lease: one line, and no Tune state written
    after it (os._exit, as a SIGKILL would: the sweep resumes from the storage)."""
    print(f"distppo: {line}", file=sys.stderr, flush=True)
    os._exit(EXIT_LEASE_LOST)


def check_conditions(probe, uri: str) -> None:
    """The start-up self-test of the conditional writes the lease stands on, on a scratch
    object of its own (`probe`: a store of leasestores): a second create-if-absent and a
    replace of a version that is not there must both be refused. An S3-compatible endpoint
    that ignores If-None-Match / If-Match would let two drivers each believe they hold the
    lease: refused in one line (UserError) instead."""
    version = probe.create(b"{}")
    try:
        for header, write in (("If-None-Match", lambda: probe.create(b"{}")),
                              ("If-Match", lambda: probe.replace(probe.NO_SUCH_VERSION, b"{}"))):
            try:
                version = write()
            except Taken:
                continue
            raise UserError(f"storage {uri} ignores {header} on writes (a conditional write "
                            "that had to fail succeeded), so the sweep's lease cannot keep two "
                            "drivers apart: use a storage with conditional writes (AWS S3, "
                            "GCS, MinIO)")
    finally:
        try:
            probe.delete(version)
        except Exception:  # noqa: BLE001 - a scratch object left behind holds no lease
            pass


class ObjectLease:
    """A lease held through `store` (leasestores.S3Store / GcsStore), renewed by a thread and
    watched by another, which ends the driver (`on_lost`) when it cannot be kept."""

    def __init__(self, store, uri: str, holder: dict, ttl_s: float, force: bool,
                 refusal: Callable[[dict], Exception],
                 on_lost: Optional[Callable[[str], None]] = None) -> None:
        self.store, self.uri, self.ttl_s = store, uri, ttl_s
        self.holder = dict(holder, ttl_s=ttl_s)
        self.on_lost = on_lost or exit_lost
        self._lock, self._stop, self._ended = threading.Lock(), threading.Event(), False
        self._deadline = 0.0  # monotonic: when this holder must have stopped (set by _write)
        self.version = self._take(force, refusal)
        self._threads = [threading.Thread(target=self._renew_loop, name="sweep-lease",
                                          daemon=True),
                         threading.Thread(target=self._watch, name="sweep-lease-watch",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    @property
    def token(self) -> str:
        return self.holder["owner"]

    def _write(self, version: Optional[str], adopt: bool = False) -> str:
        """Create (version None) or replace `version`; the holder's deadline moves on success.
        With `adopt` (taking the lease), a write refused (Taken) that put this holder's own
        token there is kept: the client retried a write whose answer was lost (botocore does),
        and the retry's condition failed on the first attempt's own object, sent after
        `sent`. (Renewals go through _adopt, which keeps the older deadline: there the object
        may be from an earlier call.)"""
        sent = time.monotonic()
        body = json.dumps(dict(self.holder, expires=time.time() + self.ttl_s)).encode()
        try:
            new = self.store.create(body) if version is None else self.store.replace(version,
                                                                                     body)
        except Taken:
            seen = self.store.read() if adopt else None
            if seen is None or seen.holder.get("owner") != self.token:
                raise
            new = seen.version
        self._deadline = sent + self.ttl_s - self.ttl_s / 6
        return new

    def _take(self, force: bool, refusal) -> str:
        for _ in range(3):  # a lease released between our create and our read: create again
            try:
                return self._write(None, adopt=True)
            except Taken:
                pass
            seen = self.store.read()
            if seen is None:
                continue
            if not force and not expired(seen, self.ttl_s):
                raise refusal(seen.holder)
            try:  # expired or forced: take it over, unless another driver did so first
                return self._write(seen.version, adopt=True)
            except Taken:
                raise refusal(seen.holder) from None
        raise refusal({})

    def _renew_loop(self) -> None:
        wait, failing = self.ttl_s / 3, False
        while not self._stop.wait(wait):
            try:
                self.version = self._write(self.version)
                wait, failing = self.ttl_s / 3, False
            except Taken:
                if self._adopt():
                    continue
                self._lose(f"sweep lease {self.uri} was taken by another driver (--force-unlock, "
                           "or this one stalled past its expiry): this driver stops")
                return
            except Exception as exc:  # noqa: BLE001 - a storage blip: retried until the deadline
                if not failing:  # one line per outage, not one per retry
                    print(f"distppo: sweep lease renewal failed, retrying until it would "
                          f"expire: {first_line(exc)}", file=sys.stderr, flush=True)
                wait, failing = self.ttl_s / 12, True

    def _adopt(self) -> bool:
        """Whether the version there is still ours: a renewal whose answer was lost wrote it.
        Its deadline stays that of the last answered one (when that write was sent is unknown)."""
        try:
            seen = self.store.read()
        except Exception:  # noqa: BLE001 - cannot tell: taken, as the condition said
            return False
        if seen is None or seen.holder.get("owner") != self.token:
            return False
        self.version = seen.version
        return True

    def _watch(self) -> None:
        while not self._stop.is_set():
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._lose(f"sweep lease {self.uri} could not be renewed before it expires "
                           "(the storage did not answer): this driver stops; resume the sweep "
                           "with --resume")
                return
            self._stop.wait(left)

    def _lose(self, line: str) -> None:
        with self._lock:
            if self._stop.is_set() or self._ended:
                return
            self._ended = True
            self._stop.set()
        self.on_lost(line)

    def release(self) -> None:
        with self._lock:
            self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        if self._ended:
            return
        try:  # only our own version: a lease another driver took stays theirs
            seen = self.store.read()
            if seen is not None and seen.version == self.version:
                self.store.delete(self.version)
        except Exception:  # noqa: BLE001 - an unreleased lease expires on its own
            pass
