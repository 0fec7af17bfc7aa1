"""Experiment trackers of a single run: Weights & Biases (`--track`, CleanRL's flags) and MLflow
(`--mlflow-tracking-uri`). Both log what TensorBoard gets: CleanRL's tag names, x-axis
global_step, one point per finished game, and the config once.

W&B logs directly (`run.log`) instead of CleanRL's `sync_tensorboard=True`: the same names and
steps without patching the TensorBoard writer, and nothing is lost when a run ends before W&B's
event-file watcher caught up. The run ids live in `<run dir>/tracking.json`, so `--resume`
continues the same W&B and MLflow runs, and so does the last step each tracker logged: a resume
re-runs the iterations since its checkpoint, and their rows go only to the run's own files, not
to the trackers a second time. W&B's config is flat, CleanRL's `vars(args)`: the flag names as
keys (and CleanRL's derived batch_size, minibatch_size, num_iterations), so queries written for
CleanRL's runs (openrlbenchmark) find these too. Sweeps track through Tune's callbacks instead
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
from distppo.errors import (
    ConfigError,
    UserError,
    answered_within,
    install_hint,
    seconds_from_env,
)
from distppo.telemetry.files import atomic_write
from distppo.telemetry.redact import redact, redact_config
from distppo.telemetry.tensorboard import TB_SCALARS, flatten

TRACKING_JSON = "tracking.json"
INSTALL_HINT = install_hint("tracking")
# How long an MLflow tracking server has to take a run's start (or a sweep's first request)
# before the command gives up in one line: MLflow's own client retries a server that does not
# answer for minutes. DISTPPO_TRACKING_TIMEOUT_S gives a slow server longer.
TRACKING_TIMEOUT_S = 30.0


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
    logged = LoggedSteps(ids_path, ids)
    trackers: list[Tracker] = []
    wanted = [(cfg.tracking.track, "wandb_run_id", "--track (W&B)",
               lambda resume: WandbTracker(cfg, run_dir, run_id, resume)),
              (cfg.tracking.mlflow_tracking_uri, "mlflow_run_id",
               f"--mlflow-tracking-uri {redact(cfg.tracking.mlflow_tracking_uri or '')}",
               lambda resume: mlflow_answers(cfg.tracking.mlflow_tracking_uri,
                                             lambda: MlflowTracker(cfg, run_id, resume)))]
    for on, key, what, make in wanted:
        if not on:
            continue
        try:
            tracker = make(ids.get(key))
        except UserError:
            close_all(trackers, ok=False)
            raise
        except Exception as exc:  # not logged in, unreachable server, refused store: user fixes
            close_all(trackers, ok=False)
            text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise UserError(f"{what} could not start: {text}") from None
        ids[key] = tracker.run_id
        trackers.append(SkipLogged(tracker, key, logged))
    if trackers:
        logged.save()
    return trackers


def mlflow_answers(uri: str, request=None):
    """request()'s result (default: a first look at the server's experiments) once the MLflow
    server at `uri` answered it; one UserError line when it has not within
    DISTPPO_TRACKING_TIMEOUT_S (TRACKING_TIMEOUT_S). An error it answers with is raised as is."""
    if request is None:
        from mlflow.tracking import MlflowClient

        def request():
            return MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    seconds = seconds_from_env("DISTPPO_TRACKING_TIMEOUT_S", TRACKING_TIMEOUT_S)
    return answered_within(request, seconds, (
        f"--mlflow-tracking-uri {redact(uri)} did not answer within {seconds:g} s: check that "
        "an MLflow server runs there and this machine reaches it (DISTPPO_TRACKING_TIMEOUT_S "
        "gives a slow one longer), or drop the flag"))


class LoggedSteps:
    """tracking.json: the run ids, and under `logged_step` the last global_step each tracker
    logged, rewritten (atomically) after every row a tracker takes."""

    def __init__(self, path: str, record: dict):
        self.path, self.record = path, record
        self.steps = record.setdefault("logged_step", {})

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.record, indent=2).encode())


class SkipLogged:
    """A tracker that takes only rows past the last step it logged: after `--resume`, the rows
    of the iterations between the checkpoint and the stop are not logged twice."""

    def __init__(self, tracker, key: str, logged: LoggedSteps):
        self.tracker, self.key, self.logged = tracker, key, logged
        self.run_id = tracker.run_id

    def log(self, row: Mapping, episodes: Iterable[tuple[float, float]]) -> None:
        step = int(row["global_step"])
        if step <= self.logged.steps.get(self.key, -1):
            return
        self.tracker.log(row, episodes)
        self.logged.steps[self.key] = step
        self.logged.save()

    def close(self, ok: bool) -> None:
        self.tracker.close(ok)


def wandb_config(cfg: TrainConfig) -> dict:
    """CleanRL's `config=vars(args)`: every flag by its flat name, plus the sizes CleanRL's
    Args fills in at runtime."""
    return redact_config({**cfg.flat(), "batch_size": cfg.batch_size,
                          "minibatch_size": cfg.minibatch_size,
                          "num_iterations": cfg.num_iterations})


def mlflow_params(cfg: TrainConfig) -> dict[str, str]:
    """MLflow's params: every setting under its dotted section name (ppo.num_steps), as text."""
    return {key: str(value) for key, value in flatten(redact_config(cfg.to_dict())).items()}


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
        # save_code, as CleanRL's runs save their script: W&B saves the program of
        # `python script.py`, none for `distppo` or `python -m distppo`, so it is named here
        # (the CLI's entry module; config.json's git commit names the rest of the code)
        entry = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "cli", "main.py")
        self.run = wandb.init(project=t.wandb_project_name, entity=t.wandb_entity, name=run_id,
                              id=self.run_id, resume="allow", dir=run_dir,
                              config=wandb_config(cfg), save_code=True,
                              settings=wandb.Settings(program_relpath="distppo/cli/main.py",
                                                      program_abspath=entry))
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
        params = [Param(k, v) for k, v in mlflow_params(cfg).items()]
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
