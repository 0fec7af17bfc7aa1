"""A driver never runs past its sweep lease, on every storage that has one.

Real parts: drivers' leases held by other live processes, the S3 API of a loopback moto server
(stopped under a holder to cut it off), GCS's JSON API of a loopback fake-gcs-server, real
uploads refused mid-copy. The clock a lease expires by is the storage's: a holder whose own
clock is an hour off changes nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pyarrow.fs as pafs
import pytest

from distppo.errors import UserError
from distppo.sweep import lease as sweep_lease
from distppo.sweep.lease import LeaseLost
from distppo.sweep.objlease import CLOCK_GRAIN_S, EXIT_LEASE_LOST
from distppo.sweep.storage import SweepStorage

from helpers import LEASE_HOLDER as HOLD
from helpers import REPO, hold_lease, kill, make_run

# every test here waits on a lease's few-second TTL: they run with nothing beside them
pytestmark = pytest.mark.serial

TTL = 3.0


def holder_process(storage: str, name: str, env: dict) -> subprocess.Popen:
    """A driver's lease in another live process, with a ttl of TTL seconds; stderr kept."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, storage, name], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, **env, DISTPPO_LEASE_TTL_S=str(TTL)))
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def ended_in_one_line(proc: subprocess.Popen, needle: str, within: float) -> str:
    """The holder ended by itself within `within` s, exit EXIT_LEASE_LOST, `needle` last."""
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        kill(proc)
        pytest.fail(f"the driver still runs {within} s after its lease was lost")
    err = proc.stderr.read()
    assert proc.returncode == EXIT_LEASE_LOST, err
    assert "Traceback" not in err, err
    assert needle in err.strip().splitlines()[-1], err
    return err


@pytest.fixture
def s3(s3_server, monkeypatch):
    fs, creds = s3_server
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sweep_lease, "LEASE_TTL_S", TTL)
    return fs, creds


# --- S3: a demoted or cut-off driver stops ----------------------------------------------------

def test_s3_driver_whose_lease_is_taken_stops_in_one_line(s3):
    fs, creds = s3
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "taken")
    first = holder_process(storage.storage, "taken", creds)
    lost = []
    forced = sweep_lease.acquire(storage, force=True, on_lost=lost.append)
    # its next renewal (every TTL / 3) finds the lease taken: it stops, it does not take it back
    ended_in_one_line(first, "was taken by another driver", within=TTL)
    assert sweep_lease.held(fs, "sweeps-bucket/sweeps/taken") is True
    with fs.open_input_stream("sweeps-bucket/sweeps/taken/.sweep.lease") as f:
        assert json.loads(f.readall())["owner"] == forced.token
    time.sleep(TTL / 3 + 0.5)
    assert not lost, "the new holder keeps renewing its lease"
    forced.release()


def test_s3_driver_that_cannot_renew_stops_before_its_lease_expires(s3_server, monkeypatch):
    from moto.server import ThreadedMotoServer
    _, creds = s3_server
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)  # this test's own, to stop
    server.start()
    host, port = server.get_host_and_port()
    creds = dict(creds, AWS_ENDPOINT_URL=f"http://{host}:{port}")
    fs = pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http",
                           region="us-east-1", access_key="testing", secret_key="testing",
                           allow_bucket_creation=True)
    fs.create_dir("cut-bucket")
    proc = holder_process("s3://cut-bucket/sweeps", "cut", creds)
    time.sleep(TTL / 3 + 0.5)  # renewed at least once
    assert proc.poll() is None
    server.stop()
    stopped = time.monotonic()
    # Its last renewal succeeded at most TTL / 3 before the cut: it must be gone before
    # TTL after it (its deadline is TTL * 5/6 after that renewal was sent).
    err = ended_in_one_line(proc, "could not be renewed before it expires", within=TTL + 2)
    assert time.monotonic() - stopped < TTL, err
    assert len(err.strip().splitlines()) <= 2, err  # one line for the outage, one for the end


def test_s3_expiry_is_the_storages_clock_not_the_holders(s3):
    fs, _ = s3
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "clock")
    key = "sweeps-bucket/sweeps/clock/.sweep.lease"

    def write(**holder):
        with fs.open_output_stream(key) as f:
            f.write(json.dumps(dict(owner="other", pid=1, host="other", **holder)).encode())

    # a holder whose clock runs an hour slow wrote this just now: live, whatever it says
    write(ttl_s=60, expires=time.time() - 3600)
    with pytest.raises(UserError, match="being run by another driver .pid 1 on other"):
        sweep_lease.acquire(storage)
    # one whose clock runs an hour fast, then killed: expired once the storage says so
    write(ttl_s=1.0, expires=time.time() + 3600)
    time.sleep(1.0 + CLOCK_GRAIN_S + 1.2)
    lease = sweep_lease.acquire(storage, on_lost=pytest.fail)
    lease.release()
    # a local lease file copied into the bucket with its sweep: no ttl, so it holds nothing
    with fs.open_output_stream(key) as f:
        f.write(json.dumps({"owner": "x", "pid": 1, "host": "laptop", "since": 0}).encode())
    assert sweep_lease.held(fs, "sweeps-bucket/sweeps/clock") is False
    lease = sweep_lease.acquire(storage, on_lost=pytest.fail)
    lease.release()


def test_s3_renewal_whose_answer_was_lost_keeps_the_lease(s3):
    # The storage wrote a renewal but its answer never came (a timeout): the next renewal's
    # condition names the old version and fails, yet the lease there is still this driver's.
    from distppo.sweep.leasestores import S3Store
    from distppo.sweep.objlease import ObjectLease
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "lostanswer")

    class LosesOneAnswer(S3Store):
        lost = 0

        def replace(self, version, body):
            new = super().replace(version, body)
            if not self.lost:
                self.lost += 1
                raise ConnectionError("read timeout")  # written, but we never hear of it
            return new

    lost = []
    store = LosesOneAnswer(storage, storage.join(sweep_lease.LEASE_NAME))
    ttl = 2 * TTL  # room for five calls to a loaded moto before the deadline
    lease = ObjectLease(store, storage.uri, sweep_lease._holder(), ttl, False,
                        lambda holder: UserError("refused"), lost.append)
    time.sleep(ttl * 1.5)  # the lost answer, then renewals on
    assert store.lost == 1 and not lost, lost
    assert sweep_lease.held(s3[0], "sweeps-bucket/sweeps/lostanswer") is True
    lease.release()


def test_s3_create_retried_after_a_lost_answer_keeps_its_own_lease(s3):
    # botocore retries a PUT whose answer was lost: the retry's If-None-Match fails on the
    # object the first attempt wrote. Both PUTs here are real; the lease is still taken.
    from distppo.sweep.leasestores import S3Store
    from distppo.sweep.objlease import ObjectLease
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "retried")

    class RetriedCreate(S3Store):
        retried = 0

        def create(self, body):
            super().create(body)  # written; its answer lost
            self.retried += 1
            return super().create(body)  # the retry: 412 on our own object

    store = RetriedCreate(storage, storage.join(sweep_lease.LEASE_NAME))
    lease = ObjectLease(store, storage.uri, sweep_lease._holder(), 2 * TTL, False,
                        lambda holder: UserError(f"refused {holder}"), pytest.fail)
    assert store.retried == 1 and store.read().version == lease.version
    assert store.read().holder["owner"] == lease.token
    lease.release()
    assert store.read() is None


def test_s3_release_deletes_only_its_own_version(s3):
    # S3's conditional DeleteObject (If-Match): a lease replaced by another driver stays
    from distppo.sweep.leasestores import S3Store
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "release")
    store = S3Store(storage, storage.join(sweep_lease.LEASE_NAME))
    ours = store.create(b'{"owner": "a"}')
    theirs = store.replace(ours, b'{"owner": "b"}')
    store.delete(ours)
    assert store.read().holder == {"owner": "b"}
    store.delete(theirs)
    assert store.read() is None
    store.delete(theirs)  # already gone: nothing to do


@pytest.mark.parametrize("ignored", ["If-None-Match", "If-Match"])
def test_endpoint_that_ignores_preconditions_is_refused_in_one_line(s3, monkeypatch, ignored):
    """An S3-compatible endpoint that drops one of the conditions (the writes themselves
    real, on moto): the start-up self-test refuses the sweep before any lease is taken."""
    from distppo.sweep import leasestores

    class Ignores(leasestores.S3Store):
        def create(self, body):
            return self._put(body) if ignored == "If-None-Match" else super().create(body)

        def replace(self, version, body):
            return self._put(body) if ignored == "If-Match" else super().replace(version, body)

    monkeypatch.setattr(leasestores, "S3Store", Ignores)
    storage = SweepStorage("s3://sweeps-bucket/sweeps", f"ignores-{ignored.lower()}")
    with pytest.raises(UserError, match=f"ignores {ignored} on writes") as refused:
        sweep_lease.acquire(storage, on_lost=pytest.fail)
    assert "\n" not in str(refused.value)
    fs, _ = s3
    assert fs.get_file_info(pafs.FileSelector(f"sweeps-bucket/sweeps/{storage.name}",
                                              allow_not_found=True)) == []


# --- uploads carry the lease's generation -----------------------------------------------------

def test_upload_of_a_demoted_driver_is_refused_even_mid_copy(s3, tmp_path):
    fs, _ = s3
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "fence")
    copies = "sweeps-bucket/sweeps/fence/runs/t"
    run_dir = tmp_path / "run"
    lost = []
    first = sweep_lease.acquire(storage, on_lost=lost.append)
    make_run(run_dir, 1)
    storage.upload_run("t", 1, str(run_dir), {"iteration": 1}, fence=sweep_lease.fence(first))
    second = sweep_lease.acquire(storage, force=True, on_lost=lost.append)
    make_run(run_dir, 2)
    with pytest.raises(LeaseLost, match="no longer this trial's driver's"):
        storage.upload_run("t", 2, str(run_dir), {"iteration": 2},
                           fence=sweep_lease.fence(first))
    # taken while a copy is on its way: checked again before the copy takes its name
    make_run(run_dir, 3, checkpoint="fifo")
    errors = []

    def upload():
        try:
            storage.upload_run("t", 3, str(run_dir), {"iteration": 3},
                               fence=sweep_lease.fence(second))
        except LeaseLost as exc:
            errors.append(exc)

    uploader = threading.Thread(target=upload)
    uploader.start()
    deadline = time.time() + 30
    while not [i for i in fs.get_file_info(pafs.FileSelector(copies, recursive=True))
               if "checkpoints" in i.path and ".partial" in i.path]:
        assert time.time() < deadline, "upload did not start"
        time.sleep(0.05)
    third = sweep_lease.acquire(storage, force=True, on_lost=lost.append)
    with open(run_dir / "checkpoints" / "ckpt_000003.pt", "wb") as f:  # unblocks the copy
        f.write(b"ckpt 3")
    uploader.join(timeout=30)
    assert len(errors) == 1, "a copy was committed under a lease that was taken meanwhile"
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(copies))]
    assert names == ["000001"], names  # no copy of 2 or 3, no staging left behind
    make_run(run_dir, 3)
    storage.upload_run("t", 3, str(run_dir), {"iteration": 3},
                       fence=sweep_lease.fence(third))
    assert storage.latest_run_copy("t")[1] == {"iteration": 3}
    deadline = time.time() + 2 * TTL
    while len(lost) < 2:  # both demoted holders saw it at their next renewal
        assert time.time() < deadline, lost
        time.sleep(0.1)
    assert all("taken by another driver" in line for line in lost), lost
    third.release()


def test_local_fence_refuses_after_release(tmp_path):
    storage = SweepStorage(str(tmp_path), "local")
    lease = sweep_lease.acquire(storage)
    fence = sweep_lease.fence(lease)
    fence.check(storage)
    lease.release()
    with pytest.raises(LeaseLost):
        fence.check(storage)


# --- local: --force-unlock never makes a second holder, node-local flock said -----------------

def test_force_unlock_never_takes_a_live_holders_lock(tmp_path):
    fs, root = pafs.LocalFileSystem(), str(tmp_path / "live")
    holder = hold_lease(str(tmp_path), "live")
    try:
        inode = os.stat(tmp_path / "live" / ".sweep.lease").st_ino
        with pytest.raises(UserError, match=f"--force-unlock cannot take a lock that a live "
                                            f"driver holds .pid {holder.pid}"):
            sweep_lease.acquire(SweepStorage(str(tmp_path), "live"), force=True)
        assert os.stat(tmp_path / "live" / ".sweep.lease").st_ino == inode  # never replaced
        assert sweep_lease.held(fs, root) is True
    finally:
        kill(holder)
    lease = sweep_lease.acquire(SweepStorage(str(tmp_path), "live"), force=True)  # dead: taken
    lease.release()


def test_node_local_flock_is_detected_and_said(tmp_path, monkeypatch, capsys):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        f"srv:/export {tmp_path}/nfs nfs4 rw,vers=4.2,local_lock=flock,addr=10.0.0.1 0 0\n"
        f"srv:/old {tmp_path}/old nfs rw,vers=3,nolock,local_lock=all 0 0\n"
        f"10.0.0.2@tcp:/fs {tmp_path}/lustre lustre rw,localflock 0 0\n"
        f"10.0.0.2@tcp:/fs2 {tmp_path}/shared lustre rw,flock 0 0\n")
    detect = sweep_lease.node_local_flock
    assert "NFS mounted local_lock=flock" in detect(f"{tmp_path}/nfs/s/.sweep.lease", mounts)
    assert "NFS mounted nolock" in detect(f"{tmp_path}/old/s/.sweep.lease", mounts)
    assert "Lustre mounted localflock" in detect(f"{tmp_path}/lustre/.sweep.lease", mounts)
    assert detect(f"{tmp_path}/shared/s/.sweep.lease", mounts) is None  # cluster-wide flock
    assert detect(f"{tmp_path}/lustre2/.sweep.lease", mounts) is None  # not under /lustre
    monkeypatch.setattr(sweep_lease, "MOUNTS", str(mounts))
    lease = sweep_lease.acquire(SweepStorage(f"{tmp_path}/lustre", "s"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds on this node only" in err, err
    assert "run one driver at a time" in err
    lease.release()
    assert sweep_lease.node_local_flock(str(tmp_path)) is None  # this machine's own mounts


# --- gs:// on a loopback GCS (fake-gcs-server: it honours ifGenerationMatch on uploads) ---------

@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """(pyarrow GCS fs, STORAGE_EMULATOR_HOST) of a loopback fake-gcs-server, leases of TTL s."""
    monkeypatch.setattr(sweep_lease, "LEASE_TTL_S", TTL)
    fs, env = gcs_server
    return fs, env["STORAGE_EMULATOR_HOST"]


def gs_storage(name: str) -> SweepStorage:
    return SweepStorage("gs://gcs-bucket/sweeps", name)  # the emulator: STORAGE_EMULATOR_HOST


def test_gs_lease_refuses_renews_expires_and_demotes(gcs):
    fs, server = gcs
    storage, root = gs_storage("lease"), "gcs-bucket/sweeps/lease"
    assert sweep_lease.held(fs, root) is False
    lost = []
    first = sweep_lease.acquire(storage, on_lost=lost.append)
    assert sweep_lease.held(fs, root) is True
    with pytest.raises(UserError, match="being run by another driver"):
        sweep_lease.acquire(storage)
    version = first.version
    time.sleep(TTL + 1.5)  # past its first ttl: renewed (a new generation), still refused
    assert first.version != version and not lost
    with pytest.raises(UserError, match="being run by another driver"):
        sweep_lease.acquire(storage)
    sweep_lease.fence(first).check(storage)
    forced = sweep_lease.acquire(storage, force=True, on_lost=lost.append)
    with pytest.raises(LeaseLost):
        sweep_lease.fence(first).check(storage)
    deadline = time.time() + TTL
    while not lost:  # the first one's next renewal finds the generation changed
        assert time.time() < deadline, "the demoted driver did not stop"
        time.sleep(0.1)
    assert "taken by another driver" in lost[0]
    first.release()  # a demoted holder's release leaves the new lease alone
    sweep_lease.fence(forced).check(storage)
    forced.release()
    assert sweep_lease.held(fs, root) is False
    # a killed driver's lease, its holder's clock an hour fast: expired by GCS's clock
    with fs.open_output_stream(f"{root}/.sweep.lease") as f:
        f.write(json.dumps({"owner": "dead", "pid": 1, "host": "dead", "ttl_s": 1.0,
                            "expires": time.time() + 3600}).encode())
    with pytest.raises(UserError, match="pid 1 on dead"):
        sweep_lease.acquire(storage)
    time.sleep(1.0 + CLOCK_GRAIN_S + 1.2)
    taken = sweep_lease.acquire(storage, on_lost=lost.append)
    assert sweep_lease.held(fs, root) is True
    taken.release()
    assert len(lost) == 1, lost


def test_gs_driver_whose_lease_is_taken_stops_in_one_line(gcs):
    fs, server = gcs
    storage = gs_storage("taken")
    first = holder_process(storage.storage, "taken", {"STORAGE_EMULATOR_HOST": server})
    forced = sweep_lease.acquire(storage, force=True, on_lost=pytest.fail)
    ended_in_one_line(first, "was taken by another driver", within=TTL)
    forced.release()
