"""W&B and MLflow for a sweep: Tune's own logger callbacks, one tracked run per trial.

The same flags as `distppo train` (--track, --wandb-project-name, --wandb-entity,
--mlflow-tracking-uri) turn them on; the trials themselves run with tracking off, so nothing
is logged twice. Each tracked run carries the config `distppo train` logs for the same flags
(tracked_config: W&B's flat CleanRL keys, MLflow's params), and each trial's result (one per
iteration) is logged under CleanRL's TensorBoard names (telemetry/trackers.scalars) plus the
per-iteration episode columns, at step global_step (MLflow) or the iteration (W&B, with
global_step as a metric to plot against). Group (W&B) and experiment (MLflow) are the sweep's
--name.
"""
from __future__ import annotations

import os
from typing import Mapping

from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

from distppo.config import SweepConfig, TrainConfig
from distppo.errors import UserError
from distppo.sweep.layout import first_line
from distppo.telemetry.redact import redact
from distppo.telemetry.trackers import mlflow_answers, mlflow_params, scalars, wandb_config

# Per-iteration columns that have no TensorBoard scalar (their per-game points live there).
EPISODE_COLUMNS = ("episodic_return_mean", "episodic_length_mean", "episodic_return_last100",
                   "episodes")


def tracked(result: Mapping) -> dict:
    """A trial's Tune result as the trackers get it; no-value entries are left out."""
    out = scalars(result)
    for key in EPISODE_COLUMNS + ("global_step",):
        value = result.get(key)
        if value is not None and value == value:  # NaN != NaN
            out[key] = value
    return out


def tracked_config(sweep: SweepConfig, trial) -> TrainConfig:
    """The config a trial's tracked run carries: its TrainConfig with the sweep's tracking
    settings, so its W&B config and MLflow params are those `distppo train` logs for the same
    flags (exp_name, CleanRL's flat keys), not only Tune's {env_id, algo, seed}."""
    env_id, algo, seed = (trial.config[key] for key in ("env_id", "algo", "seed"))
    return sweep.trial_config(env_id, algo, seed).replace(
        track=sweep.train.tracking.track,
        mlflow_tracking_uri=sweep.train.tracking.mlflow_tracking_uri)


class MlflowCallback(MLflowLoggerCallback):
    def __init__(self, sweep: SweepConfig, **kwargs):
        super().__init__(**kwargs)
        self.sweep = sweep

    def log_trial_start(self, trial) -> None:
        # Tune's own, with `distppo train`'s params beside trial.config's grid point. A
        # callback that Tune restored from state pickled without `sweep` logs Tune's own.
        if getattr(self, "sweep", None) is None:
            return super().log_trial_start(trial)
        if trial not in self._trial_runs:
            run = self.mlflow_util.start_run(tags={**self.tags, "trial_name": str(trial)},
                                             run_name=str(trial))
            self._trial_runs[trial] = run.info.run_id
        params = {**mlflow_params(tracked_config(self.sweep, trial)), **trial.config}
        self.mlflow_util.log_params(run_id=self._trial_runs[trial], params_to_log=params)

    def log_trial_result(self, iteration: int, trial, result: dict):
        # Tune's MLflow step is timesteps_total when a result has it: our global_step.
        super().log_trial_result(iteration, trial, {**tracked(result),
                                                    "timesteps_total": result["global_step"]})


class _WandbActor(_WandbLoggingActor):
    """Tune's W&B logging actor for one trial, returning only once W&B's service process has
    exited. Tune kills the actor, and Ray its child processes, as soon as run() returns, and
    wandb.finish() returns before that service has written the run's last records: on a busy
    node an offline run lost its whole history so. teardown() waits for the service, as
    W&B's exit hook would in a process that is not killed."""

    def run(self):
        super().run()
        self._wandb.teardown()


class WandbCallback(WandbLoggerCallback):
    _logger_actor_cls = _WandbActor

    def __init__(self, sweep: SweepConfig, **kwargs):
        super().__init__(**kwargs)
        self.sweep = sweep

    def _start_logging_actor(self, trial, exclude_results, **wandb_init_kwargs):
        # Tune's log_trial_start passes trial.config; W&B gets `distppo train`'s flat config
        # (Tune's own where a restored callback was pickled without `sweep`)
        if getattr(self, "sweep", None) is not None:
            wandb_init_kwargs["config"] = wandb_config(tracked_config(self.sweep, trial))
        super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)

    def log_trial_result(self, iteration: int, trial, result: dict):
        keep = {k: result[k] for k in ("training_iteration", "trial_id") if k in result}
        super().log_trial_result(iteration, trial, {**tracked(result), **keep})


def mlflow_starts(uri: str) -> None:
    """One line, before Tune starts, where the MLflow server does not answer (within a bound)
    or answers with an error: Tune's callback would meet it inside fit(), after waiting out
    MLflow's retries, as a traceback."""
    try:
        mlflow_answers(uri)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the server or store said, in one line
        raise UserError(f"--mlflow-tracking-uri {redact(uri)} could not start: "
                        f"{first_line(exc)}") from None


def tracking_callbacks(cfg: SweepConfig) -> list:
    """The Tune callbacks the sweep's tracking flags ask for (none by default)."""
    t = cfg.train.tracking
    callbacks: list = []
    if t.mlflow_tracking_uri:
        mlflow_starts(t.mlflow_tracking_uri)
        callbacks.append(MlflowCallback(cfg, tracking_uri=t.mlflow_tracking_uri,
                                        experiment_name=cfg.name,
                                        tags={"distppo.sweep": cfg.name}))
    if t.track:
        # W&B logs from one Ray actor per trial, which does not see this process's
        # environment: pass on the settings users give W&B through it.
        env = {key: os.environ[f"WANDB_{key.upper()}"] for key in ("mode", "dir")
               if os.environ.get(f"WANDB_{key.upper()}")}
        callbacks.append(WandbCallback(cfg, project=t.wandb_project_name, entity=t.wandb_entity,
                                       group=cfg.name, **env))
    return callbacks
