"""Readers of objects that a live sweep replaces in place, on a loopback S3 (moto).

Arrow's S3 input stream asks an object's size (HEAD) when it opens and reads that many bytes
later (a ranged GET). The sweep's lease is rewritten at every renewal and trials.parquet at
every trial's report, so a reader in between got the new object cut short or padded with NULs:
a trial's fence then saw no owner and refused its run copy (LeaseLost: a trial restart in the
chaos soak on s3), and `distppo status` lost trials.parquet's word for a trial. Each test
replaces the object as fast as the product's own writer can while the product's reader reads.
"""
from __future__ import annotations

import threading

import pyarrow as pa

from distppo.sweep import lease as sweep_lease
from distppo.sweep.layout import TRIALS_FILE
from distppo.sweep.outputs import recorded_statuses
from distppo.sweep.storage import SweepStorage

READS = 150


def replaced_while(write, read, reads: int = READS) -> tuple[int, list]:
    """(writes done, what each of `reads` reads returned) while a thread calls `write`."""
    stop, writes = threading.Event(), []

    def writer():
        while not stop.is_set():
            write(len(writes))
            writes.append(1)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        seen = [read() for _ in range(reads)]
    finally:
        stop.set()
        thread.join(timeout=30)
    return len(writes), seen


def test_fence_holds_while_its_lease_is_renewed(s3_server, monkeypatch):
    fs, creds = s3_server
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "renewed")
    lease = sweep_lease.acquire(storage, on_lost=print)
    fence = sweep_lease.fence(lease)

    def renew(_):  # the renewal thread's own write: same owner, a new `expires`
        with lease._lock:
            lease.version = lease._write(lease.version)

    def check():
        try:
            fence.check(storage)
            return True
        except sweep_lease.LeaseLost:
            return False

    try:
        writes, held = replaced_while(renew, check)
    finally:
        lease.release()
    assert writes > READS / 3, f"only {writes} renewals: the race was not exercised"
    assert all(held), f"{held.count(False)} of {READS} fence checks refused the current lease"


def test_trial_statuses_read_while_trials_parquet_is_rewritten(s3_server, monkeypatch):
    fs, creds = s3_server
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "rewritten")
    schema = pa.schema([("trial_id", pa.string()), ("status", pa.string())])

    def rewrite(n):  # the driver's writer; each version a different size
        rows = [{"trial_id": f"t{i}", "status": "running"} for i in range(1 + n % 7)]
        storage.write_table(TRIALS_FILE, [pa.Table.from_pylist(rows, schema=schema)], schema)

    rewrite(0)
    writes, seen = replaced_while(rewrite, lambda: recorded_statuses(storage), reads=100)
    assert writes > 20, f"only {writes} rewrites: the race was not exercised"
    lost = [s for s in seen if s.get("t0") != "running"]
    assert not lost, f"{len(lost)} of {len(seen)} reads lost trials.parquet"
