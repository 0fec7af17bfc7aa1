"""SweepConfig: a grid of training runs (games x algos x seeds) and the trial id that keys
them in the sweep's files."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from distppo.config.experiment import sweep_line
from distppo.config.sections import flag_name
from distppo.config.train import TrainConfig
from distppo.envs.games import resolve_backend, resolve_env_id
from distppo.errors import ConfigError


@dataclass(frozen=True)
class SweepConfig:
    """A grid of training runs (games x algos x seeds), one Ray Tune trial each (sweep.py)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """settings every trial shares (backend, total_timesteps, sizes, runner/learner resources,
    checkpoint_every, local); env_id, algo and seed come from the grid. A backend asked as
    auto is resolved per game (backend_of)"""
    games: tuple[str, ...] = ()
    """env ids, already expanded (sweep.expand_games turns `atari57` or a file into ids)"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """base seeds; every (game, algo) pair runs once per seed"""
    algos: tuple[str, ...] = ("ppo",)
    """algorithms to run on every game: ppo | ppo_lstm"""
    storage: str = "sweeps"
    """local folder or a URI pyarrow understands (s3://, gs://, file://); the sweep lives in
    <storage>/<name>"""
    name: str = "sweep"
    """sweep folder name under the storage"""
    max_concurrent_trials: int = 0
    """most trials running at once; 0 = as many as the cluster's free resources allow"""
    max_failures: int = 2
    """times a crashed trial restarts from its last checkpoint before it counts as failed"""
    trials_per_node: int | Literal["auto"] = "auto"
    """trials one node runs at once; their default CPU reservations (and learner GPUs when
    auto) grow or shrink to share the node evenly. auto: on a node with GPUs that the learners
    use, one trial per 4 CPUs, at most 4 per GPU (16 CPUs + 1 GPU: 4 trials of 4 CPUs and 0.25
    GPU); on CPUs, as many as the reservations fit (docs/benchmarks.md "Sweep packing")"""
    trial_cpus: float = 1.0
    """CPUs reserved for each trial's own process: the training loop (runners and learner get
    their own bundles), or the whole run with --local"""
    outputs_every_s: float = 60.0
    """seconds between rewrites of iterations.parquet and trials.parquet while trials run
    (after a new trial checkpoint), so `distppo report` works on a running or killed sweep"""

    def __post_init__(self) -> None:
        # "2" from the command line and 2 from a stored sweep are the same setting
        if isinstance(self.trials_per_node, str) and self.trials_per_node.strip().isdigit():
            object.__setattr__(self, "trials_per_node", int(self.trials_per_node))
        self.validate()

    def validate(self) -> None:
        if self.trials_per_node != "auto" and not (
                isinstance(self.trials_per_node, int) and self.trials_per_node > 0):
            raise ConfigError(f"--trials-per-node must be auto or a number > 0, got "
                              f"{self.trials_per_node!r}")
        for key, flag in (("games", "--games"), ("seeds", "--seeds"), ("algos", "--algo")):
            values = getattr(self, key)
            if not values:
                raise ConfigError(f"{flag} needs at least one value")
            if len(set(values)) != len(values):
                raise ConfigError(f"{flag} lists a value twice: {' '.join(map(str, values))}")
        for env_id in self.games:
            resolve_env_id(env_id, self.backend_of(env_id))
        for algo in self.algos:
            self.trial_config(self.games[0], algo, self.seeds[0])  # e.g. ppo_lstm divisibility
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"--name {self.name!r} must be a plain folder name")
        if not self.storage:
            raise ConfigError("--storage must name a folder or a URI")
        for key in ("max_concurrent_trials", "max_failures", "trial_cpus", "outputs_every_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"--{flag_name(key)} must be >= 0, got {getattr(self, key)}")

    def grid(self) -> list[tuple[str, str, int]]:
        """Every (env_id, algo, seed) of the sweep, seed-major as Tune orders the grid."""
        return [(g, a, s) for s in self.seeds for a in self.algos for g in self.games]

    def trial_config(self, env_id: str, algo: str, seed: int) -> TrainConfig:
        """The TrainConfig of one grid point; its run folder is named by its trial id. Trials
        do not track themselves: the sweep's Tune callbacks do (sweep/tracking.py)."""
        return self.train.replace(env_id=env_id, algo=algo, seed=seed,
                                  run_name=trial_id(env_id, algo, seed), track=False,
                                  mlflow_tracking_uri=None)

    def backend_of(self, env_id: str) -> str:
        """The backend a game's trials run on: the one asked, `auto` resolved for its id."""
        return resolve_backend(env_id, self.train.env.asked_backend)

    def backends(self) -> tuple[str, ...]:
        """The backends the sweep's trials run on, in the order of its games."""
        return tuple(dict.fromkeys(self.backend_of(g) for g in self.games))

    def experiments(self) -> str:
        """The first line `distppo sweep` and `plan` print (config/experiment.py)."""
        return sweep_line(self.games, self.algos, self.backend_of, self.train.env.asked_backend)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        # what was asked: `auto` is resolved per trial (config.json of each run records it)
        d["train"]["env"]["backend"] = self.train.env.asked_backend
        return d

    @staticmethod
    def from_dict(d: dict) -> "SweepConfig":
        kw = dict(d, train=TrainConfig.from_dict(d["train"]))
        # A test-only field that older sweep.json files may hold (faults are testing/faults.py's).
        kw.pop("fail_once_at_iteration", None)
        for key in ("games", "seeds", "algos"):
            kw[key] = tuple(kw[key])
        return SweepConfig(**kw)


def trial_id(env_id: str, algo: str, seed: int) -> str:
    """Stable across restarts and resumes: the key of trials.parquet and iterations.parquet."""
    return f"{env_id}__{algo}__{seed}"
