"""One typed, frozen configuration; every field has a docstring that becomes its `--help` line.

Defaults equal CleanRL's `ppo_atari.py` (see shared/reference/hyperparameters.md, section 1).
`validate()` runs at construction and raises ConfigError with a one-line fix.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Optional

from distppo.envs.games import BACKENDS, NO_ALE_VIDEO, resolve_env_id
from distppo.errors import ConfigError

ALGOS = ("ppo", "ppo_lstm")
DEVICES = ("auto", "cpu", "cuda")
RUNNER_DEVICES = ("cpu", "cuda")
AMP = ("off", "bf16")
MAX_SEED = 2**31 - 1

# What --resume may change: where and how the run executes, how it logs and checkpoints, and
# how long it trains (only longer: the learning rate anneals over the new total from then on).
# Every other field defines the learning problem; changing one mid-run would give a run that
# is neither the old config nor the new one.
RESUME_SAFE = ("total_timesteps", "local", "device", "cuda", "num_env_runners", "envs_per_runner",
               "runner_cpus", "num_threads", "runner_max_restarts", "learner_cpus",
               "learner_gpus", "runner_device", "runner_gpus", "capture_video",
               "checkpoint_every", "keep_checkpoints", "log_every", "channels_last", "compile",
               "fused_lstm", "omp_spincount", "malloc_reuse", "grad_shards")


@dataclass(frozen=True)
class EnvConfig:
    env_id: str = "BreakoutNoFrameskip-v4"
    """game id: `Breakout-v5` or `BreakoutNoFrameskip-v4` (either backend maps it), or a
    gymnasium vector-obs id such as CartPole-v1"""
    backend: str = "envpool"
    """vector env implementation: envpool (EnvPool, Linux) | gym (gymnasium + ale-py, DeepMind
    wrappers in Python, CleanRL's ppo_atari.py) | ale (ale-py's C++ vector env)"""
    num_envs: int = 8
    """total number of parallel environments (summed over all env runners)"""
    capture_video: bool = False
    """record MP4 videos of env 0's full games to <run dir>/videos"""
    max_episode_steps: Optional[int] = None
    """Atari time limit per game in agent steps (4 frames each); a game cut by it is a done.
    Default: the reference script's, envpool 108,000 (EnvPool 0.6.6, ppo_atari_envpool's
    benchmark), gym 27,000 = the v4 ids' 108,000 frames (docs/semantics.md)"""

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        _positive(self, "num_envs")
        resolved = resolve_env_id(self.env_id, self.backend)  # unknown or incompatible ids
        if self.max_episode_steps is not None:
            _positive(self, "max_episode_steps")
            if resolved.kind != "atari":
                raise ConfigError(f"--max-episode-steps applies to Atari games only; "
                                  f"{self.env_id} keeps its own limit: drop the flag")
        if self.capture_video and self.backend == "ale":
            raise ConfigError(NO_ALE_VIDEO)


@dataclass(frozen=True)
class PPOConfig:
    algo: str = "ppo"
    """ppo (Nature CNN, 4 stacked frames) | ppo_lstm (1 frame, LSTM(512 -> 128))"""
    total_timesteps: int = 10_000_000
    """total agent steps summed over envs (one agent step = 4 emulator frames on Atari)"""
    learning_rate: float = 2.5e-4
    """Adam learning rate (eps 1e-5)"""
    num_steps: int = 128
    """rollout length per env and iteration"""
    anneal_lr: bool = True
    """anneal the learning rate linearly towards 0 over the iterations"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation"""
    num_minibatches: int = 4
    """minibatches per epoch (LSTM: whole env sequences, num_envs / num_minibatches envs each)"""
    update_epochs: int = 4
    """epochs over the batch per iteration"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.1
    """surrogate clipping coefficient (policy and value)"""
    clip_vloss: bool = True
    """clip the value loss around the rollout-time value, as CleanRL's torch scripts do"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global L2 norm to which gradients are clipped"""
    target_kl: Optional[float] = None
    """stop the epochs of an iteration early when approx_kl exceeds this (off by default)"""
    lstm_exact_resets: bool = True
    """ppo_lstm on envpool (next-step auto-reset): zero the LSTM state before the first
    observation of a new life and leave EnvPool's reset step out of the loss, as in the gym
    ordering; off = CleanRL's LSTM loop on EnvPool's ordering, unchanged (docs/semantics.md)"""

    def validate(self) -> None:
        if self.algo not in ALGOS:
            raise ConfigError(f"unknown algo {self.algo!r}: use one of {', '.join(ALGOS)}")
        for name in ("total_timesteps", "learning_rate", "num_steps", "num_minibatches",
                     "update_epochs", "max_grad_norm"):
            _positive(self, name)
        for name in ("clip_coef", "ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"--{_flag(name)} must lie in [0, 1], got {getattr(self, name)}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ConfigError(f"--target-kl must be > 0 when given, got {self.target_kl}")


@dataclass(frozen=True)
class RunnerConfig:
    num_env_runners: str = "auto"
    """env-runner actors on the Ray path; the num_envs envs are split evenly across them. auto:
    one per 4 CPUs of the largest node (the largest divisor of num_envs that fits; 1 on a node
    of up to 7 CPUs, in --local mode and in sweep trials), distributed/resources.py"""
    envs_per_runner: Optional[int] = None
    """envs per env runner; when given, num_envs becomes num_env_runners * this"""
    runner_cpus: float = 1.0
    """CPUs Ray reserves per env runner (fractions allowed)"""
    num_threads: str = "auto"
    """torch intra-op threads per process: auto (the CPUs each process owns: --local all
    cores; Ray from the node's CPUs, split between runners and learners with --overlap,
    distributed/resources.py) or a number for every process, capped at the cores it may run on
    (recorded; decides bit-equality)"""
    omp_spincount: str = "10000"
    """GNU OpenMP spin count (GOMP_SPINCOUNT) of torch's worker threads in the processes this
    command starts: how long an idle torch thread busy-waits before it sleeps. 10000: idle
    threads stop spinning on the cores EnvPool steps on (docs/benchmarks.md); `default`:
    libgomp's own (300,000, as CleanRL runs). Set before torch loads, by `distppo train` and
    `distppo sweep` for themselves and the local Ray they start; a GOMP_SPINCOUNT already in the
    environment wins, and on a cluster joined through RAY_ADDRESS the nodes' environment does"""
    malloc_reuse: bool = True
    """glibc malloc keeps the memory torch frees for the next minibatch instead of returning it
    to the kernel and faulting it in again (mallopt: mmap threshold 1 GiB, 32 MiB on glibc <
    2.35, no trim), in every process of the run (core/threads.py); the learning is unchanged,
    the heap keeps its high-water mark. Off: glibc's own, as CleanRL runs. No effect off glibc"""
    overlap: bool = False
    """runners collect iteration k+1 with weights k while learners update on k (policy lag 1);
    off = CleanRL"""
    runner_max_restarts: int = 3
    """times Ray restarts a dead env runner; its rollout is re-requested with the same weights"""
    runner_device: str = "cpu"
    """device of the env runners' policy copies (rollout inference): cpu | cuda"""
    runner_gpus: str = "auto"
    """GPUs Ray reserves per env runner with --runner-device cuda, in (0, 1]: a number, or auto
    (0.25, less where the runners would take over half the cluster's GPUs: they share that
    half, and the learners with --learner-gpus auto the rest)"""

    def __post_init__(self) -> None:
        # "2" from the command line and 2 from an old config.json are the same setting
        for name in ("num_threads", "num_env_runners"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().isdigit():
                object.__setattr__(self, name, int(value))
        object.__setattr__(self, "omp_spincount", str(self.omp_spincount).strip())
        if self.runner_gpus != "auto":
            try:
                object.__setattr__(self, "runner_gpus", float(self.runner_gpus))
            except ValueError:
                raise ConfigError(f"--runner-gpus must be auto or a number in (0, 1], got "
                                  f"{self.runner_gpus!r}") from None

    def validate(self) -> None:
        _auto_or_positive(self, "num_env_runners")
        if self.envs_per_runner is not None:
            _positive(self, "envs_per_runner")
        _positive(self, "runner_cpus")
        _auto_or_positive(self, "num_threads")
        if self.omp_spincount != "default" and not self.omp_spincount.isdigit():
            raise ConfigError(f"--omp-spincount must be default or a number >= 0, got "
                              f"{self.omp_spincount!r}")
        if self.runner_device not in RUNNER_DEVICES:
            raise ConfigError(f"unknown runner device {self.runner_device!r}: use one of "
                              f"{', '.join(RUNNER_DEVICES)}")
        if self.runner_gpus != "auto" and not 0 < self.runner_gpus <= 1:
            raise ConfigError(f"--runner-gpus must lie in (0, 1], got {self.runner_gpus}")
        if self.runner_max_restarts < 0:
            raise ConfigError(f"--runner-max-restarts must be >= 0, got {self.runner_max_restarts}")


@dataclass(frozen=True)
class LearnerConfig:
    cuda: bool = True
    """use CUDA for the learner when a GPU is visible, as CleanRL's --cuda; --no-cuda keeps it
    on the CPU"""
    device: str = "auto"
    """learner device: auto (follows --cuda) | cpu | cuda (requires a GPU: fails when none is
    visible)"""
    num_learners: int = 1
    """data-parallel learner actors on the Ray path"""
    learner_gpus: str = "auto"
    """GPUs Ray reserves per learner: auto (1 when the cluster or machine has a GPU and the
    learner may use CUDA, else 0) or a number"""
    learner_cpus: float = 1.0
    """CPUs Ray reserves per learner"""
    channels_last: bool = True
    """Nature CNN in channels_last memory layout (faster convolutions on CPU and GPU; float
    rounding differs from CleanRL's layout: --no-channels-last for bit-equal numbers)"""
    fused_lstm: bool = True
    """PPO-LSTM's update runs the LSTM over each stretch between done steps in one nn.LSTM
    call (same numbers within float rounding); --no-fused-lstm: one call per time step, as
    ppo_atari_lstm.py"""
    compile: bool = False
    """torch.compile the learner's model (same numbers within float rounding)"""
    grad_shards: str = "auto"
    """a CPU learner computes each minibatch's gradient as the sum of this many slices of it,
    side by side, each on a fixed number of torch threads (core/shards.py); with --overlap the
    slices run one by one while the runners sample and side by side once they have delivered,
    with the same numbers either way. auto: with --overlap's handover (a small node), one slice
    per thread the update may use, of at least 64 samples (PPO-LSTM: whole envs); otherwise 1.
    Always 1 on a GPU. 1: CleanRL's single pass. Same learning within float rounding
    (recorded)"""
    amp: str = "off"
    """mixed precision of the learner's update: off | bf16 (GPU only)"""

    def __post_init__(self) -> None:
        if isinstance(self.grad_shards, str) and self.grad_shards.strip().isdigit():
            object.__setattr__(self, "grad_shards", int(self.grad_shards))
        if isinstance(self.learner_gpus, str) and self.learner_gpus != "auto":
            try:
                object.__setattr__(self, "learner_gpus", float(self.learner_gpus))
            except ValueError:
                raise ConfigError(f"--learner-gpus must be auto or a number >= 0, got "
                                  f"{self.learner_gpus!r}") from None
        elif isinstance(self.learner_gpus, int):
            object.__setattr__(self, "learner_gpus", float(self.learner_gpus))

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}: use one of {', '.join(DEVICES)}")
        if self.device == "cuda" and not self.cuda:
            raise ConfigError("--device cuda contradicts --no-cuda: drop one of them")
        _positive(self, "num_learners")
        _positive(self, "learner_cpus")
        _auto_or_positive(self, "grad_shards")
        if self.compile and self.grad_shards not in ("auto", 1):
            raise ConfigError(f"--grad-shards {self.grad_shards} with --compile: a compiled "
                              "model runs one pass at a time; drop one of them")
        if self.learner_gpus != "auto" and self.learner_gpus < 0:
            raise ConfigError(f"--learner-gpus must be >= 0, got {self.learner_gpus}")
        if self.amp not in AMP:
            raise ConfigError(f"unknown --amp {self.amp!r}: use one of {', '.join(AMP)}")
        if self.amp != "off" and (self.device == "cpu" or not self.cuda):
            raise ConfigError(f"--amp {self.amp} needs the learner on a GPU: drop --amp or "
                              "--device cpu/--no-cuda")


@dataclass(frozen=True)
class TrackConfig:
    track: bool = False
    """log the run to Weights & Biases, as CleanRL's --track (pip install 'distppo[tracking]';
    WANDB_MODE=offline writes the run locally)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project of --track"""
    wandb_entity: Optional[str] = None
    """the W&B entity (team) of --track; default: your W&B user"""
    mlflow_tracking_uri: Optional[str] = None
    """also log the run to MLflow at this tracking URI (file:///path/mlruns, http://host:5000),
    experiment --exp-name (a sweep: experiment --name)"""

    def validate(self) -> None:
        if not self.wandb_project_name:
            raise ConfigError("--wandb-project-name must not be empty")
        if self.mlflow_tracking_uri is not None and not self.mlflow_tracking_uri:
            raise ConfigError("--mlflow-tracking-uri must not be empty: give a URI or drop it")


@dataclass(frozen=True)
class TrainConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    tracking: TrackConfig = field(default_factory=TrackConfig)
    exp_name: str = "distppo"
    """experiment name, part of the run name"""
    seed: int = 1
    """base seed; env i of runner r gets a seed derived from (seed, r, i), see seeds.py"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic and deterministic algorithms"""
    local: bool = False
    """run everything in this process with no Ray at all (breakpoints work)"""
    output_dir: str = "runs"
    """folder that holds one sub-folder per run"""
    run_name: Optional[str] = None
    """run folder name (default <env_id>__<exp_name>__<seed>__<unix time>)"""
    checkpoint_every: int = 100
    """write a checkpoint every N iterations (and always at the end)"""
    keep_checkpoints: int = 3
    """newest checkpoints kept in <run dir>/checkpoints, older ones are deleted (0 = keep all)"""
    log_every: int = 1
    """print a progress line every N iterations"""
    save_model: bool = False
    """at the end, save the model's state_dict to <run dir>/<exp_name>.cleanrl_model, as
    CleanRL's --save-model (the parameter names of CleanRL's Agent)"""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for part in (self.env, self.ppo, self.runner, self.learner, self.tracking):
            part.validate()
        _positive(self, "checkpoint_every")
        _positive(self, "log_every")
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
        m = self.learner.num_learners
        if e.num_envs % m or (p.algo == "ppo_lstm" and (e.num_envs // m) % p.num_minibatches) or (
                (e.num_envs // m) * p.num_steps % p.num_minibatches):
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
        # auto is resolved where the run's CPUs are known (resources.resolve_runners)
        if r.num_env_runners != "auto" and e.num_envs % r.num_env_runners:
            raise ConfigError(
                f"num_envs = {e.num_envs} cannot be split evenly over num_env_runners = "
                f"{self.runner.num_env_runners}: make num_envs a multiple of it")
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
    def runner_num_envs(self) -> int:
        """Envs each env runner steps (num_envs split evenly over the runners); the runner
        count must be resolved (a number: resources.resolve_runners)."""
        return self.env.num_envs // self.runner.num_env_runners

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "TrainConfig":
        kw = {k: (SECTIONS[k](**v) if k in SECTIONS else v) for k, v in d.items()}
        return TrainConfig(**kw)

    def replace(self, **flat) -> "TrainConfig":
        """A copy with flat field names (as on the command line) replaced, validated.

        `envs_per_runner` sets num_envs = num_env_runners * envs_per_runner, so either way of
        sizing the envs gives a consistent config.
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
                raise ConfigError(f"--{_flag(name)} {value} differs from the run's {old}: "
                                  f"--resume cannot change it, only {resume_flags()}")
        if new.ppo.total_timesteps < self.ppo.total_timesteps:
            raise ConfigError(f"--total-timesteps {new.ppo.total_timesteps} is less than the "
                              f"run's {self.ppo.total_timesteps}: --resume can only extend a run")
        return new, changed


def resume_flags() -> str:
    """The flags --resume may change, for --help and the refusal line."""
    return ", ".join("--total-timesteps (larger only)" if n == "total_timesteps"
                     else f"--{_flag(n)}" for n in RESUME_SAFE)


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


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _positive(obj, name: str) -> None:
    value = getattr(obj, name)
    if not value > 0:
        raise ConfigError(f"--{_flag(name)} must be > 0, got {value}")


def _auto_or_positive(obj, name: str) -> None:
    value = getattr(obj, name)
    if value != "auto" and not (isinstance(value, int) and value > 0):
        raise ConfigError(f"--{_flag(name)} must be auto or a number > 0, got {value!r}")


@dataclass(frozen=True)
class SweepConfig:
    """A grid of training runs (games x algos x seeds), one Ray Tune trial each (sweep.py)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """settings every trial shares (backend, total_timesteps, sizes, runner/learner resources,
    checkpoint_every, local); env_id, algo and seed come from the grid"""
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
    trial_cpus: float = 1.0
    """CPUs reserved for each trial's own process: the training loop (runners and learner get
    their own bundles), or the whole run with --local"""
    outputs_every_s: float = 60.0
    """seconds between rewrites of iterations.parquet and trials.parquet while trials run
    (after a new trial checkpoint), so `distppo report` works on a running or killed sweep"""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for key, flag in (("games", "--games"), ("seeds", "--seeds"), ("algos", "--algo")):
            values = getattr(self, key)
            if not values:
                raise ConfigError(f"{flag} needs at least one value")
            if len(set(values)) != len(values):
                raise ConfigError(f"{flag} lists a value twice: {' '.join(map(str, values))}")
        for env_id in self.games:
            resolve_env_id(env_id, self.train.env.backend)
        for algo in self.algos:
            self.trial_config(self.games[0], algo, self.seeds[0])  # e.g. ppo_lstm divisibility
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"--name {self.name!r} must be a plain folder name")
        if not self.storage:
            raise ConfigError("--storage must name a folder or a URI")
        for key in ("max_concurrent_trials", "max_failures", "trial_cpus", "outputs_every_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"--{_flag(key)} must be >= 0, got {getattr(self, key)}")

    def grid(self) -> list[tuple[str, str, int]]:
        """Every (env_id, algo, seed) of the sweep, seed-major as Tune orders the grid."""
        return [(g, a, s) for s in self.seeds for a in self.algos for g in self.games]

    def trial_config(self, env_id: str, algo: str, seed: int) -> TrainConfig:
        """The TrainConfig of one grid point; its run folder is named by its trial id. Trials
        do not track themselves: the sweep's Tune callbacks do (sweep/tracking.py)."""
        return self.train.replace(env_id=env_id, algo=algo, seed=seed,
                                  run_name=trial_id(env_id, algo, seed), track=False,
                                  mlflow_tracking_uri=None)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "SweepConfig":
        kw = dict(d, train=TrainConfig.from_dict(d["train"]))
        # A test-only field of sweeps written before distppo 0.2 (now testing/faults.py).
        kw.pop("fail_once_at_iteration", None)
        for key in ("games", "seeds", "algos"):
            kw[key] = tuple(kw[key])
        return SweepConfig(**kw)


def trial_id(env_id: str, algo: str, seed: int) -> str:
    """Stable across restarts and resumes: the key of trials.parquet and iterations.parquet."""
    return f"{env_id}__{algo}__{seed}"
