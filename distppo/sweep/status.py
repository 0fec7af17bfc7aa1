"""`distppo status`: where a sweep stands, read from its storage alone, strictly read-only.

Works on a running, finished or killed sweep, local or on any pyarrow file system (s3://),
without Ray and without the sweep's driver: it opens files for reading only and never writes.
Whether the driver is alive it reads from the sweep's lease (sweep/lease.py `held`: a shared
lock tried and dropped at once, or the S3 / GCS lease's ttl), else from how recently its files
changed.

Per trial it reads (sweep/layout.py):
- the newest complete run copy, runs/<trial_id>/<iteration>/ (SweepStorage): trial.json
  (finished, elapsed_s, node) and its metrics (telemetry/parquet.py read_rows, a few columns);
- the end of Tune's <trial_id>/result.json: the rows since that copy (one per iteration);
- Tune's newest experiment_state-*.json: the trial's status and its restarts.
So it needs neither iterations.parquet nor trials.parquet; its states and restart counts come
from the rules trials.parquet uses too (sweep/states.py, docs/sweeps.md).
"""
from __future__ import annotations

import json
import math
import posixpath
import time
from dataclasses import asdict, dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs

from distppo.config import SweepConfig
from distppo.errors import ConfigError, UserError
from distppo.placement.sizing import trial_bundles
from distppo.sweep import lease as sweep_lease
from distppo.sweep.layout import (
    RUNS,
    SWEEP_JSON,
    TRIAL_JSON,
    filesystem,
    first_line,
    json_object,
    read_object,
)
from distppo.sweep.outputs import recorded_statuses
from distppo.sweep.schedule import lpt_makespan
from distppo.sweep.states import (
    PREEMPTION,
    RESTART,
    STATES,
    last_restart_preempted,
    saved_tune_status,
    trial_restarts,
    trial_state,
)
from distppo.sweep.storage import SweepStorage
from distppo.telemetry.parquet import read_rows
from distppo.telemetry.redact import redact
from distppo.telemetry.runlayout import METRICS

STALE_AFTER_S = 300.0  # Tune syncs a trial's results to object stores every few minutes
STATUS_COLUMNS = ("iteration", "global_step", "wall_clock_s", "sps", "runner_restarts")
RECENT_ROWS = 5  # current SPS: over the last rows, not the run's mean
RESULT_TAIL_BYTES = 64 * 1024  # the end of result.json is enough for its last rows


@dataclass
class TrialStatus:
    trial_id: str
    env_id: str
    algo: str
    seed: int
    state: str
    iteration: int
    num_iterations: int
    global_step: int
    total_timesteps: int
    sps: Optional[float]         # over the last RECENT_ROWS rows
    sps_mean: Optional[float]    # global_step / wall_clock_s of the last row
    restarts: int                # runner_restarts of the last row
    trial_restarts: int          # restarts of the trial after a crash (fault log, Tune)
    trial_preemptions: int       # restarts of the trial after Ray preempted its node
    node: str
    wall_clock_s: float          # trial time so far, including start-up and earlier attempts
    eta_s: Optional[float]


@dataclass
class SweepStatus:
    uri: str
    state: str                   # running | finished | interrupted
    driver_seen_s_ago: Optional[float]
    trials: list
    counts: dict
    gpus_per_trial: float
    gpu_hours: float
    trial_hours: float
    concurrency: int
    concurrency_from: str
    remaining_s: Optional[float]
    makespan_s: Optional[float]

    def to_dict(self) -> dict:
        return asdict(self)


def split_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """(file system, sweep folder) of `<storage>/<name>`; one line when it holds no sweep."""
    fs, root = filesystem(uri.rstrip("/"), "cannot open sweep")
    try:
        info = fs.get_file_info(posixpath.join(root, SWEEP_JSON))
    except OSError as exc:
        raise UserError(f"cannot read sweep {uri}: {first_line(exc)}") from None
    if info.type != pafs.FileType.File:
        raise UserError(f"{uri} holds no sweep (no {SWEEP_JSON}): give <storage>/<name> of a "
                        "sweep started with `distppo sweep`")
    return fs, root


def read_status(uri: str, stale_after_s: float = STALE_AFTER_S,
                now: Optional[float] = None) -> SweepStatus:
    fs, root = split_uri(uri)
    now = time.time() if now is None else now
    try:
        with fs.open_input_stream(posixpath.join(root, SWEEP_JSON)) as f:
            cfg = SweepConfig.from_dict(json.loads(f.readall()))
    except (ConfigError, KeyError, TypeError, ValueError, OSError) as exc:
        raise UserError(f"{uri}/{SWEEP_JSON} is not a valid sweep config ({exc})") from None
    tune_state, mtimes = _tune_state(fs, root), _mtimes(fs, root)
    seen = max(mtimes.values(), default=None)
    seen_ago = None if seen is None else max(now - seen, 0.0)
    alive = sweep_lease.held(fs, root, now)
    if alive is None:
        alive = seen_ago is not None and seen_ago <= stale_after_s
    store = SweepStorage.at(fs, root, uri)
    recorded = recorded_statuses(store)
    trials = [_trial(store, cfg, point, tune_state.get(point, {}), recorded, alive)
              for point in cfg.grid()]
    return _summarise(uri, cfg, trials, alive, seen_ago, fs, root, now)


def _trial(store: SweepStorage, cfg: SweepConfig, point: tuple, tune: dict, recorded: dict,
           alive: bool) -> TrialStatus:
    tcfg = cfg.trial_config(*point)
    tid = tcfg.run_name
    copy = store.latest_run_copy(tid)
    record, rows = ({}, []) if copy is None else (copy[1], read_rows(
        posixpath.join(copy[0], METRICS), store.fs, STATUS_COLUMNS, lenient=True))
    newer = [r for r in _result_rows(store.fs, store.path, tid)
             if r.get("iteration", 0) > (rows[-1]["iteration"] if rows else 0)]
    rows = rows + newer
    last = rows[-1] if rows else {}
    tune_status = saved_tune_status(tune.get("status"), recorded.get(tid))
    total = tcfg.ppo.total_timesteps
    step, iteration = int(last.get("global_step", 0)), int(last.get("iteration", 0))
    logged, newest_fault = store.fault_log(tid).tally()
    state = trial_state(tune_status, bool(record.get("finished")), iteration,
                        tcfg.num_iterations, alive, last_restart_preempted(newest_fault))
    wall = max(float(record.get("elapsed_s", 0.0)), float(last.get("trial_elapsed_s", 0.0)))
    sps = _recent_sps(rows)
    eta = (total - step) / sps if state == "running" and sps else None
    return TrialStatus(
        trial_id=tid, env_id=point[0], algo=point[1], seed=point[2], state=state,
        iteration=iteration, num_iterations=tcfg.num_iterations,
        global_step=step, total_timesteps=total, sps=sps, sps_mean=_num(last.get("sps")),
        restarts=int(last.get("runner_restarts", 0) or 0),
        trial_restarts=trial_restarts(tune_status, int(tune.get("num_failures", 0)),
                                      logged[RESTART]),
        trial_preemptions=logged[PREEMPTION],
        node=record.get("node") or last.get("hostname") or "-", wall_clock_s=wall, eta_s=eta)


def _summarise(uri, cfg, trials, alive, seen_ago, fs, root, now) -> SweepStatus:
    counts = {s: sum(t.state == s for t in trials) for s in STATES}
    gpus = sum(b.get("GPU", 0.0) for b in trial_bundles(cfg.train, cfg.trial_cpus))
    trial_s = sum(t.wall_clock_s for t in trials)
    if cfg.max_concurrent_trials:
        slots, slots_from = cfg.max_concurrent_trials, "max_concurrent_trials"
    else:
        slots, slots_from = max(counts["running"], 1), "trials running now"
    ended = counts["done"] + counts["failed"] == len(trials)
    remaining = 0.0 if ended else _remaining(trials, slots)
    started = _mtime(fs, posixpath.join(root, SWEEP_JSON))
    makespan = None
    if remaining is not None and started is not None:
        # an ended sweep, or one whose driver is gone, stopped when its files last changed
        until = now if alive and not ended else now - (seen_ago or 0.0)
        makespan = max(until - started, 0.0) + remaining
    state = "finished" if ended else "running" if alive else "interrupted"
    return SweepStatus(uri=redact(uri), state=state, driver_seen_s_ago=seen_ago, trials=trials,
                       counts=counts, gpus_per_trial=gpus, gpu_hours=trial_s * gpus / 3600,
                       trial_hours=trial_s / 3600, concurrency=slots, concurrency_from=slots_from,
                       remaining_s=remaining, makespan_s=makespan)


def _remaining(trials: list, slots: int) -> Optional[float]:
    """Seconds until the last trial ends: running trials hold their slots for their ETA, the
    rest (pending, preempted, stopped: resumed) at the measured SPS of their game, else the
    sweep's mean. None while nothing has been measured."""
    measured = [t for t in trials if t.sps_mean]
    if not measured:
        return None if any(t.state != "done" for t in trials) else 0.0
    mean = sum(t.sps_mean for t in measured) / len(measured)
    by_game: dict = {}
    for t in measured:
        by_game.setdefault((t.env_id, t.algo), []).append(t.sps_mean)
    busy, todo = [], []
    for t in trials:
        if t.state == "running" and t.eta_s is not None:
            busy.append(t.eta_s)
        elif t.state in ("pending", "stopped", "running", "preempted"):
            rates = by_game.get((t.env_id, t.algo))
            sps = sum(rates) / len(rates) if rates else mean
            todo.append((t.total_timesteps - t.global_step) / sps)
    return lpt_makespan(todo, slots, busy)


# -- reading the storage ---------------------------------------------------------------------

def _result_rows(fs, root: str, tid: str) -> list[dict]:
    """The last rows of Tune's result.json of the trial (only its end is read)."""
    path = posixpath.join(root, tid, "result.json")
    try:
        with fs.open_input_file(path) as f:
            size = f.size()
            f.seek(max(size - RESULT_TAIL_BYTES, 0))
            text = f.read().decode("utf-8", "replace")
    except (OSError, pa.ArrowException):
        return []
    lines = text.split("\n")[:-1]  # the part after the last newline may be half written
    if size > RESULT_TAIL_BYTES:
        lines = lines[1:]  # the read began inside a line
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "iteration" in row and "global_step" in row:
            rows.append(row)
    return sorted(rows, key=lambda r: r["iteration"])


def _tune_state(fs, root: str) -> dict:
    """{(env_id, algo, seed): {"status", "num_failures"}} from Tune's newest experiment state;
    {} when there is none or it cannot be parsed (Tune's private format may change)."""
    selector = pafs.FileSelector(root, allow_not_found=True)
    states = sorted(i.path for i in fs.get_file_info(selector)
                    if posixpath.basename(i.path).startswith("experiment_state-"))
    if not states:
        return {}
    out = {}
    try:
        data = read_object(fs, states[-1], json_object)  # Tune rewrites it in place
        for entry in data["trial_data"]:
            trial, meta = (json.loads(x) if isinstance(x, str) else x for x in entry[:2])
            c = trial["config"]
            out[(c["env_id"], c["algo"], int(c["seed"]))] = {
                "status": trial.get("status"), "num_failures": meta.get("num_failures", 0)}
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError, IndexError):
        return {}
    return out


def _mtimes(fs, root: str) -> dict:
    """{path: mtime} of the files a live driver and its trials keep writing."""
    out = {}
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        name = posixpath.basename(info.path)
        # an S3 / GCS lease is rewritten every LEASE_TTL_S / 3 by a live driver
        if info.type == pafs.FileType.File and (name.startswith("experiment_state-")
                                                 or "lease" in name.lower()):
            out[info.path] = info.mtime.timestamp() if info.mtime else None
        elif info.type == pafs.FileType.Directory and name != RUNS:
            out[info.path] = _mtime(fs, posixpath.join(info.path, "result.json"))
    runs = pafs.FileSelector(posixpath.join(root, RUNS), allow_not_found=True, recursive=True)
    for info in fs.get_file_info(runs):
        if posixpath.basename(info.path) == TRIAL_JSON and info.mtime:
            out[info.path] = info.mtime.timestamp()
    return {k: v for k, v in out.items() if v is not None}


def _mtime(fs, path: str) -> Optional[float]:
    info = fs.get_file_info(path)
    return info.mtime.timestamp() if info.type == pafs.FileType.File and info.mtime else None


def _recent_sps(rows: list[dict]) -> Optional[float]:
    """Steps per second over the last RECENT_ROWS rows of one attempt; the row's own SPS
    (the run's mean) when there is only one."""
    if not rows:
        return None
    last = rows[-1]
    window = [r for r in rows[-RECENT_ROWS - 1:-1]
              if r.get("wall_clock_s", 0) < last.get("wall_clock_s", 0)]
    if window:
        first = window[0]
        dt = last["wall_clock_s"] - first["wall_clock_s"]
        if dt > 0:
            return (last["global_step"] - first["global_step"]) / dt
    return _num(last.get("sps"))


def _num(value) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else float(value)


# -- text --------------------------------------------------------------------------------------

def format_status(s: SweepStatus) -> str:
    seen = "-" if s.driver_seen_s_ago is None else f"{s.driver_seen_s_ago:,.0f} s ago"
    lines = [f"sweep {s.uri}: {s.state} (last write {seen})",
             f"{'trial':34s} {'state':9s} {'iter':>11s} {'steps':>23s} {'SPS':>8s} "
             f"{'restarts':>8s} {'node':12s} {'ETA':>8s}"]
    for t in s.trials:
        sps = "-" if t.sps is None else f"{t.sps:,.0f}"
        lines.append(
            f"{t.trial_id:34s} {t.state:9s} {f'{t.iteration}/{t.num_iterations}':>11s} "
            f"{f'{t.global_step:,}/{t.total_timesteps:,}':>23s} {sps:>8s} "
            f"{t.restarts:>8d} {t.node[:12]:12s} {_hms(t.eta_s):>8s}")
    c = s.counts
    lines.append(f"trials: {c['done']}/{len(s.trials)} done, {c['running']} running, "
                 f"{c['pending']} pending, {c['failed']} failed, {c['stopped']} stopped"
                 + (f", {c['preempted']} preempted" if c["preempted"] else ""))
    preempted = sum(t.trial_preemptions for t in s.trials)
    if preempted:
        lines.append(f"preemptions: {preempted} (Ray preempted a trial's node; not failures, "
                     "the trial continues from its newest run copy)")
    lines.append(f"GPU-hours so far: {s.gpu_hours:,.2f} (trial hours {s.trial_hours:,.3f} x "
                 f"{s.gpus_per_trial:g} GPU per trial)")
    lines.append(f"remaining: {_hms(s.remaining_s)}, makespan estimate {_hms(s.makespan_s)} "
                 f"({s.concurrency} trial(s) at once, from {s.concurrency_from}; measured SPS "
                 "per game, else the sweep's mean; LPT scheduling)")
    if s.counts["stopped"]:
        lines.append("no driver is alive: continue the sweep with `distppo sweep --storage "
                     "<storage> --name <name> --resume`")
    return "\n".join(lines)


def _hms(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
