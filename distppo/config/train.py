"""TrainConfig: one run's whole config (its sections, config/sections.py), validated at
construction, and what the CLI and --resume read from it: the flat field names, each field's
docstring, and the fields --resume may change.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Optional

from distppo.config.experiment import experiment_line
from distppo.config.fields import execution, identity, meta, output
from distppo.config.sections import (
    MAX_SEED,
    EnvConfig,
    LearnerConfig,
    PPOConfig,
    RunnerConfig,
    TrackConfig,
    flag_name,
    positive,
)
from distppo.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    tracking: TrackConfig = field(default_factory=TrackConfig)
    exp_name: str = output("distppo")
    """experiment name, part of the run name"""
    seed: int = identity(1, per_trial=True)
    """base seed; env i of runner r gets a seed derived from (seed, r, i), see seeds.py"""
    torch_deterministic: bool = execution(True)
    """sets torch.backends.cudnn.deterministic to this value in every process that runs torch
    (the loop's, the learners', the env runners'), as CleanRL's flag does; nothing else"""
    local: bool = execution(False, resume=True)
    """run everything in this process with no Ray at all (breakpoints work)"""
    output_dir: str = output("runs", per_trial=True)
    """folder that holds one sub-folder per run"""
    run_name: Optional[str] = output(None, per_trial=True)
    """run folder name (default <env_id>__<exp_name>__<seed>__<unix time>)"""
    checkpoint_every: int = output(100, resume=True)
    """write a checkpoint every N iterations (and always at the end)"""
    keep_checkpoints: int = output(3, resume=True)
    """newest checkpoints kept in <run dir>/checkpoints, older ones are deleted (0 = keep all)"""
    log_every: int = output(1, resume=True, per_trial=True)
    """print a progress line every N iterations"""
    save_model: bool = output(False)
    """at the end, save the model's state_dict to <run dir>/<exp_name>.cleanrl_model, as
    CleanRL's --save-model (the parameter names of CleanRL's Agent)"""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for part in (self.env, self.ppo, self.runner, self.learner, self.tracking):
            part.validate()
        positive(self, "checkpoint_every")
        positive(self, "log_every")
        if self.keep_checkpoints < 0:
            raise ConfigError(f"--keep-checkpoints must be >= 0 (0 = keep all), got "
                              f"{self.keep_checkpoints}")
        p, e = self.ppo, self.env
        # env j of runner incarnation k is seeded seed + k*num_envs + j (core/seeds.py); numpy
        # takes seeds below 2**32 and EnvPool below 2**31
        top = MAX_SEED - e.num_envs * (self.runner.runner_max_restarts + 1) + 1
        if not 0 <= self.seed <= top:
            raise ConfigError(f"--seed must lie in [0, {top}] (the env seeds derived from it "
                              f"must fit in 31 bits), got {self.seed}")
        if self.batch_size % p.num_minibatches:
            raise ConfigError(
                f"num_envs*num_steps = {self.batch_size} is not divisible by num_minibatches = "
                f"{p.num_minibatches}: pick sizes whose product is a multiple of it")
        if p.algo == "ppo_lstm" and e.num_envs % p.num_minibatches:
            raise ConfigError(
                f"ppo_lstm minibatches hold whole env sequences: num_envs = {e.num_envs} must be "
                f"divisible by num_minibatches = {p.num_minibatches}")
        if p.exact_replay:
            check_exact_replay(self)
        if self.learner.cuda_graphs and p.algo != "ppo":
            raise ConfigError(f"--cuda-graphs is for --algo ppo (the feedforward agent), not "
                              f"{p.algo}: drop --cuda-graphs")
        m, share = self.learner.num_learners, self.learner_num_envs
        if e.num_envs % m or (p.algo == "ppo_lstm" and share % p.num_minibatches) or (
                share * p.num_steps % p.num_minibatches):
            raise ConfigError(
                f"num_envs = {e.num_envs} must split evenly over num_learners = {m}, and each "
                f"learner's share into num_minibatches = {p.num_minibatches}: adjust the sizes")
        r = self.runner
        if r.envs_per_runner is not None and r.num_env_runners == "auto":
            raise ConfigError("--envs-per-runner needs a number of env runners: give "
                              "--num-env-runners too, or --num-envs instead")
        if r.envs_per_runner is not None and e.num_envs != r.num_env_runners * r.envs_per_runner:
            raise ConfigError(
                f"num_envs = {e.num_envs} contradicts num_env_runners = {r.num_env_runners} x "
                f"envs_per_runner = {r.envs_per_runner}: give --num-envs or --envs-per-runner")
        # auto is resolved where the run's CPUs are known (placement/resolve.py)
        if r.num_env_runners != "auto" and e.num_envs % r.num_env_runners:
            raise ConfigError(
                f"num_envs = {e.num_envs} cannot be split evenly over num_env_runners = "
                f"{self.runner.num_env_runners}: make num_envs a multiple of it")
        envs = (e.num_envs if r.num_env_runners == "auto" else e.num_envs // r.num_env_runners)
        if envs % r.env_groups:
            raise ConfigError(
                f"--env-groups {r.env_groups} cannot split the {envs} envs of an env runner "
                "evenly: make it a divisor of them")
        if p.total_timesteps < self.batch_size:
            raise ConfigError(
                f"total_timesteps = {p.total_timesteps} is less than one iteration "
                f"(num_envs*num_steps = {self.batch_size}): raise --total-timesteps")

    # Derived sizes, exactly as CleanRL derives them.
    @property
    def batch_size(self) -> int:
        return self.env.num_envs * self.ppo.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.ppo.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.ppo.total_timesteps // self.batch_size

    @property
    def learner_num_envs(self) -> int:
        """Envs each learner trains on: its share of num_envs (validate() checks it splits)."""
        return self.env.num_envs // self.learner.num_learners

    @property
    def runner_num_envs(self) -> int:
        """Envs each env runner steps (num_envs split evenly over the runners); the runner
        count must be resolved (a number: placement/resolve.py)."""
        return self.env.num_envs // self.runner.num_env_runners

    def experiment(self) -> str:
        """The first line a run prints: which CleanRL experiment it is (config/experiment.py)."""
        return experiment_line(self.env.env_id, self.ppo.algo, self.env.backend,
                               self.env.asked_backend)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "TrainConfig":
        kw = {k: (SECTIONS[k](**v) if k in SECTIONS else v) for k, v in d.items()}
        return TrainConfig(**kw)

    def replace(self, **flat) -> "TrainConfig":
        """A copy with flat field names (as on the command line) replaced, validated.

        `envs_per_runner` sets num_envs = num_env_runners * envs_per_runner, so either way of
        sizing the envs gives a consistent config. A backend asked as `auto` is resolved again
        for the new env id; an explicit one (a stored run's) stays.
        """
        per_runner = flat.get("envs_per_runner")
        if per_runner is not None and "num_envs" not in flat:
            if not per_runner > 0:
                raise ConfigError(f"--envs-per-runner must be > 0, got {per_runner}")
            runners = flat.get("num_env_runners", self.runner.num_env_runners)
            if str(runners).isdigit():  # with auto, validate() says what to give instead
                flat = dict(flat, num_envs=int(runners) * per_runner)
        nested: dict = {}
        top = {}
        for key, value in flat.items():
            owner = FLAT_FIELDS.get(key)
            if owner is None:
                raise ConfigError(f"unknown setting {key!r}")
            if owner == "":
                top[key] = value
            else:
                nested.setdefault(owner, {})[key] = value
        if "env" in nested:  # a backend asked as auto follows a new env id
            nested["env"].setdefault("backend", self.env.asked_backend)
        for owner, kw in nested.items():
            top[owner] = dataclasses.replace(getattr(self, owner), **kw)
        return dataclasses.replace(self, **top)


    def flat(self) -> dict:
        """{flat field name: value}, the names of the command line."""
        return {name: getattr(getattr(self, owner), name) if owner else getattr(self, name)
                for name, owner in FLAT_FIELDS.items()}

    def resumed(self, given: dict) -> tuple["TrainConfig", dict]:
        """This stored config with the flags given to --resume; returns it and the changed
        fields {name: [old, new]}. A change outside RESUME_SAFE is a one-line ConfigError."""
        new = self.replace(**given)
        before, after = self.flat(), new.flat()
        changed = {k: [before[k], after[k]] for k in FLAT_FIELDS if before[k] != after[k]}
        for name, (old, value) in changed.items():
            if name not in RESUME_SAFE:
                raise ConfigError(f"--{flag_name(name)} {value} differs from the run's {old}: "
                                  f"--resume cannot change it, only {resume_flags()}")
        if new.ppo.total_timesteps < self.ppo.total_timesteps:
            raise ConfigError(f"--total-timesteps {new.ppo.total_timesteps} is less than the "
                              f"run's {self.ppo.total_timesteps}: --resume can only extend a run")
        return new, changed


# (algo, backend) -> the CleanRL script --exact-replay replays
REPLAYED_SCRIPTS = {("ppo", "envpool"): "ppo_atari_envpool.py", ("ppo", "gym"): "ppo_atari.py",
                    ("ppo_lstm", "gym"): "ppo_atari_lstm.py"}


def check_exact_replay(cfg: TrainConfig) -> None:
    """--exact-replay's one process, one runner, one learner and CleanRL's kernels: anything
    asked that would draw other numbers or round differently is a one-line ConfigError."""
    pair = (cfg.ppo.algo, cfg.env.backend)
    if pair not in REPLAYED_SCRIPTS:
        scripts = "; ".join(f"--algo {a} --backend {b} ({s})"
                            for (a, b), s in REPLAYED_SCRIPTS.items())
        raise ConfigError(f"--exact-replay replays one of CleanRL's scripts and --algo "
                          f"{pair[0]} --backend {pair[1]} is none of them: use {scripts}")
    r, lcfg = cfg.runner, cfg.learner
    refused = ((f"--num-env-runners {r.num_env_runners}", r.num_env_runners not in ("auto", 1)),
               (f"--num-learners {lcfg.num_learners}", lcfg.num_learners > 1),
               ("--overlap", r.overlap), (f"--env-groups {r.env_groups}", r.env_groups > 1),
               ("--compile", lcfg.compile),
               (f"--grad-shards {lcfg.grad_shards}", lcfg.grad_shards not in ("auto", 1)),
               ("--cuda-graphs", lcfg.cuda_graphs), (f"--amp {lcfg.amp}", lcfg.amp != "off"),
               ("--device cuda", lcfg.device == "cuda"),
               ("--runner-device cuda", r.runner_device == "cuda"))
    for what, on in refused:
        if on:
            raise ConfigError(f"--exact-replay does not combine with {what}: CleanRL's script "
                              f"steps one vector env and updates once on the CPU; drop {what}")


def resume_flags() -> str:
    """The flags --resume may change, for --help and the refusal line."""
    names = sorted(RESUME_SAFE, key=lambda n: n != "total_timesteps")  # the budget first
    return ", ".join("--total-timesteps (larger only)" if n == "total_timesteps"
                     else f"--{flag_name(n)}" for n in names)


SECTIONS = {"env": EnvConfig, "ppo": PPOConfig, "runner": RunnerConfig, "learner": LearnerConfig,
            "tracking": TrackConfig}


def _leaf_fields():
    """{flat field name: section name ('' for TrainConfig's own)}; flat names are unique."""
    out = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            out[f.name] = section
    for f in dataclasses.fields(TrainConfig):
        if f.name not in SECTIONS:
            out[f.name] = ""
    return out


FLAT_FIELDS = _leaf_fields()


def _field(name: str) -> dataclasses.Field:
    owner = FLAT_FIELDS[name]
    cls = SECTIONS[owner] if owner else TrainConfig
    return cls.__dataclass_fields__[name]


def fields_where(**wanted) -> tuple[str, ...]:
    """Flat field names, in field order, whose declared metadata (config/fields.py) matches,
    e.g. fields_where(role="algorithm") or fields_where(resume=True)."""
    return tuple(n for n in FLAT_FIELDS
                 if all(meta(_field(n))[k] == v for k, v in wanted.items()))


# What --resume may change: where and how the run executes, how it logs and checkpoints, and
# how long it trains (only longer: the learning rate anneals over the new total from then on).
# Every other field defines the learning problem; changing one mid-run would give a run that
# is neither the old config nor the new one.
RESUME_SAFE = fields_where(resume=True)


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> dict:
    """The docstring under each dataclass field (as tyro reads them), from the class source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = nxt.value.value.strip()
    return docs
