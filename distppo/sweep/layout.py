"""Where everything of a sweep lives: file names and the file system of a storage URI.

Shared by the writer (the sweep driver and its trials) and the readers (`distppo report`,
`distppo status`), so a name is defined once. Ray-free.

    <storage>/<name>/
        sweep.json                  the SweepConfig; on --resume the stored one wins
        trials.parquet              one row per grid point (telemetry/schema.py TRIAL_COLUMNS)
        iterations.parquet          every checkpointed iteration row of every trial
        runs/<trial_id>/<iteration>/  a trial's run folder at a trainer checkpoint; complete
                                      once its trial.json exists (written last)
        faults/<trial_id>/          the faults the trial survived, one file each
                                    (telemetry/faultlog.py): never rolled back with a copy
        <trial_id>/                 Tune's trial folder (results, error.txt, pointer checkpoints)
        tuner.pkl, experiment_state-*.json, ...   Tune's experiment state
"""
from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Callable, Optional, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from distppo.errors import UserError, answered_within, seconds_from_env

SWEEP_JSON = "sweep.json"
TRIALS_FILE = "trials.parquet"
ITERATIONS_FILE = "iterations.parquet"
TUNER_STATE = "tuner.pkl"  # Tune's marker of a restorable experiment (Tuner.can_restore)
RUNS = "runs"
FAULTS = "faults"
TRIAL_JSON = "trial.json"  # sweep bookkeeping of one run copy; its presence marks it complete
POINTER_JSON = "run_copy.json"  # the content of a trial's Tune checkpoints
KEEP_COPIES = 2  # run copies kept per trial
# How long Arrow's GCS client retries a request that fails transiently (an endpoint that does
# not answer included) before it gives up: google-cloud-cpp's own default is 15 minutes.
GCS_RETRY_LIMIT_S = 60
# How long a storage has to answer its first request (a look at the sweep folder) before the
# command gives up in one line, and the longest stall of each later S3 request attempt;
# DISTPPO_STORAGE_TIMEOUT_S lets a slow private endpoint have longer.
ANSWER_TIMEOUT_S = 20.0
# read_object's tries: enough that a writer replacing the object without pause (trials.parquet
# in a large sweep) does not make every one fail; under a second of pauses in all
READ_TRIES, READ_PAUSE_S = 10, 0.02
# What decides where each scheme's requests go and with which credentials.
WHERE_TO_LOOK = {
    "gs": "STORAGE_EMULATOR_HOST (an emulator or a private endpoint) and the Google credentials",
    "s3": "AWS_ENDPOINT_URL (an S3-compatible endpoint) and the AWS credentials",
}


def absolute(storage: str) -> str:
    """A local folder made absolute (Tune wants that); a URI unchanged. No trailing slash."""
    if "://" not in storage:
        storage = os.path.abspath(storage)
    return storage.rstrip("/") or "/"


def filesystem(uri: str, what: str = "--storage",
               answer_s: Optional[float] = None) -> tuple[pafs.FileSystem, str]:
    """(file system, path inside it) of a local folder or any URI pyarrow resolves (s3://,
    gs://, file://), once it has answered a first request; a one-line UserError when the URI
    cannot be resolved or the storage does not answer within `answer_s` (default:
    DISTPPO_STORAGE_TIMEOUT_S, else ANSWER_TIMEOUT_S).

    gs:// follows STORAGE_EMULATOR_HOST as Google's own clients do (an emulator or a private
    endpoint, no credentials), as s3:// follows AWS_ENDPOINT_URL in Arrow itself."""
    answer_s = seconds_from_env("DISTPPO_STORAGE_TIMEOUT_S", ANSWER_TIMEOUT_S) \
        if answer_s is None else answer_s
    try:
        fs, path = pafs.FileSystem.from_uri(arrow_uri(absolute(uri)))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UserError(f"{what} {uri}: {first_line(exc)}") from None
    if isinstance(fs, pafs.S3FileSystem):
        fs = stalls_bounded(fs, answer_s)
    answered_within(lambda: _look(fs, path), answer_s, _silent(uri, what, answer_s))
    return fs, path


def stalls_bounded(fs: pafs.S3FileSystem, stall_s: float) -> pafs.S3FileSystem:
    """The same S3 file system, each attempt of a request given up after `stall_s` seconds
    without a byte (connecting or transferring): with the AWS SDK's defaults, which Arrow keeps,
    an endpoint that stops answering mid-sweep holds each request for over a minute. Arrow's retry
    strategy makes 3 attempts. The settings travel with the file system when it is pickled (Tune
    hands it to every trial) since they are its constructor's own arguments: `__reduce__` is
    how pickling rebuilds it."""
    rebuild, (kwargs,) = fs.__reduce__()
    return rebuild({**kwargs, "request_timeout": stall_s, "connect_timeout": stall_s})


def _silent(uri: str, what: str, answer_s: float) -> str:
    scheme = uri.partition("://")[0] if "://" in uri else "file"
    look = WHERE_TO_LOOK.get("gs" if scheme == "gcs" else scheme, "the folder's mount")
    return (f"{what} {uri}: the storage did not answer within {answer_s:g} s: check the URI "
            f"and {look}")


def _look(fs: pafs.FileSystem, path: str) -> None:
    """A first request, whose error is left for the command's own request to report: only
    whether the storage answered matters here."""
    try:
        fs.get_file_info(path)
    except Exception:  # noqa: BLE001 - the command's next request meets it again
        pass


def arrow_uri(uri: str) -> str:
    """The URI as Arrow should open it: a gs:// one gets the emulator of STORAGE_EMULATOR_HOST
    (Arrow's `anonymous@` user and its `endpoint_override`, `scheme` query parameters) unless
    it names an endpoint itself, and a bounded retry time unless it sets one."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("gs", "gcs"):
        return uri
    query = dict(urllib.parse.parse_qsl(parts.query))
    netloc = parts.netloc
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if emulator and "endpoint_override" not in query:
        scheme, _, host = emulator.rpartition("://")
        query.update(endpoint_override=host, scheme=scheme or "http")
        netloc = "anonymous@" + netloc.rpartition("@")[2]
    query.setdefault("retry_limit_seconds", str(GCS_RETRY_LIMIT_S))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path,
                                    urllib.parse.urlencode(query), ""))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or exc.__class__.__name__
    return text.splitlines()[0]


T = TypeVar("T")


def read_object(fs: pafs.FileSystem, path: str, decode: Callable[[bytes], T]) -> T:
    """`decode` of the object at `path`, read again while its bytes do not decode.

    Arrow's S3 input stream asks an object's size (HEAD) when it opens and reads that many
    bytes later (a ranged GET): an object replaced between the two (the lease a driver renews,
    trials.parquet rewritten) comes back cut short or padded with NULs. No JSON object and no
    Parquet file decodes from such bytes, so a decode that fails is read again; an object of
    the same size read whole is the new one. A read that fails (FileNotFoundError, the
    storage) is not tried again; the last decode error is raised when every try failed."""
    for attempt in range(READ_TRIES - 1):
        body = _whole(fs, path)
        try:
            return decode(body)
        except (ValueError, OSError, pa.ArrowException):  # Parquet's bad footer: OSError
            time.sleep(READ_PAUSE_S * (attempt + 1))
    return decode(_whole(fs, path))


def _whole(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.readall()


def json_object(body: bytes) -> dict:
    """A JSON object's bytes as a dict ({} for an empty body); ValueError for anything else."""
    value = json.loads(body or b"{}")
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {type(value).__name__}")
    return value
