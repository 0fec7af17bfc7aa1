"""Experiment trackers of a single run: Weights & Biases (`--track`, CleanRL's flags) and MLflow
(`--mlflow-tracking-uri`). Both log what TensorBoard gets: CleanRL's tag names, x-axis
global_step, one point per finished game, and the config once.

W&B logs directly (`run.log`) instead of CleanRL's `sync_tensorboard=True`: the same names and
steps without patching the TensorBoard writer, and nothing is lost when a run ends before W&B's
event-file watcher caught up. The run ids live in `<run dir>/tracking.json`, so `--resume`
continues the same W&B and MLflow runs. Sweeps track through Tune's callbacks instead
(sweep/tracking.py); trials run with these off. The libraries are optional (the `tracking`
extra) and imported only when asked for.
"""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import time
from typing import Iterable, Mapping, Optional, Protocol

from distppo.config import TrainConfig
from distppo.errors import ConfigError, UserError, install_hint
from distppo.telemetry.redact import redact
from distppo.telemetry.tensorboard import TB_SCALARS, flatten

TRACKING_JSON = "tracking.json"
INSTALL_HINT = install_hint("tracking")


class Tracker(Protocol):
    def log(self, row: Mapping, episodes: Iterable[tuple[float, float]]) -> None: ...
    def close(self, ok: bool) -> None: ...


def check_trackers(cfg: TrainConfig) -> None:
    """Before anything is written: a tracker asked for must be installed."""
    t = cfg.tracking
    for wanted, module, flag in ((t.track, "wandb", "--track"),
                                 (t.mlflow_tracking_uri, "mlflow", "--mlflow-tracking-uri")):
        if wanted and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{flag} needs the {module} package: {INSTALL_HINT}, or drop {flag}")


def make_trackers(cfg: TrainConfig, run_dir: str, run_id: str) -> list[Tracker]:
    """The trackers the config asks for, resuming the runs named in tracking.json if any."""
    ids_path = os.path.join(run_dir, TRACKING_JSON)
    ids = {}
    if os.path.exists(ids_path):
        with open(ids_path) as f:
            ids = json.load(f)
    trackers: list[Tracker] = []
    wanted = [(cfg.tracking.track, "wandb_run_id", "--track (W&B)",
               lambda resume: WandbTracker(cfg, run_dir, run_id, resume)),
              (cfg.tracking.mlflow_tracking_uri, "mlflow_run_id",
               f"--mlflow-tracking-uri {redact(cfg.tracking.mlflow_tracking_uri or '')}",
               lambda resume: MlflowTracker(cfg, run_id, resume))]
    for on, key, what, make in wanted:
        if not on:
            continue
        try:
            trackers.append(make(ids.get(key)))
        except Exception as exc:  # not logged in, unreachable server, refused store: user fixes
            close_all(trackers, ok=False)
            text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise UserError(f"{what} could not start: {text}") from None
        ids[key] = trackers[-1].run_id
    if trackers:
        with open(ids_path, "w") as f:
            json.dump(ids, f, indent=2)
    return trackers


def close_all(trackers: list[Tracker], ok: bool) -> None:
    for tracker in trackers:
        tracker.close(ok)


def scalars(row: Mapping) -> dict[str, float]:
    """TensorBoard's scalars of a row; no-value columns (None or NaN) are left out."""
    out = {}
    for tag, column in TB_SCALARS.items():
        value = row[column]
        if value is not None and value == value:  # NaN != NaN
            out[tag] = float(value)
    return out


class WandbTracker:
    """One W&B run per training run (offline with WANDB_MODE=offline); files in <run dir>/wandb."""

    def __init__(self, cfg: TrainConfig, run_dir: str, run_id: str, resume_id: Optional[str]):
        import wandb

        self.run_id = resume_id or secrets.token_hex(4)  # W&B's own ids are 8 characters too
        t = cfg.tracking
        self.run = wandb.init(project=t.wandb_project_name, entity=t.wandb_entity, name=run_id,
                              id=self.run_id, resume="allow", dir=run_dir, config=cfg.to_dict())
        # CleanRL's charts use global_step as the x-axis (its TensorBoard step).
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")

    def log(self, row: Mapping, episodes: Iterable[tuple[float, float]]) -> None:
        step = int(row["global_step"])
        for ret, length in episodes:
            self.run.log({"charts/episodic_return": float(ret),
                          "charts/episodic_length": float(length), "global_step": step})
        self.run.log({**scalars(row), "global_step": step})

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class MlflowTracker:
    """One MLflow run per training run, in the experiment named --exp-name."""

    def __init__(self, cfg: TrainConfig, run_id: str, resume_id: Optional[str]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=cfg.tracking.mlflow_tracking_uri)
        if resume_id:
            self.run_id = resume_id
            self.client.update_run(resume_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(cfg.exp_name)
        experiment_id = (experiment.experiment_id if experiment else
                         self.client.create_experiment(cfg.exp_name))
        run = self.client.create_run(experiment_id, run_name=run_id,
                                     tags={"distppo.run_id": run_id})
        self.run_id = run.info.run_id
        params = [Param(k, str(v)) for k, v in flatten(cfg.to_dict()).items()]
        self.client.log_batch(self.run_id, params=params)

    def log(self, row: Mapping, episodes: Iterable[tuple[float, float]]) -> None:
        from mlflow.entities import Metric

        step, now = int(row["global_step"]), int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars(row).items()]
        for ret, length in episodes:
            metrics += [Metric("charts/episodic_return", float(ret), now, step),
                        Metric("charts/episodic_length", float(length), now, step)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")
