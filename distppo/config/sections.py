"""The sections of a training config (env, ppo, runner, learner, tracking): frozen dataclasses,
one docstring per field (its `--help` line), each with the `validate()` of its own fields;
TrainConfig (config/train.py) validates what spans sections.

Defaults equal CleanRL's `ppo_atari.py` (see shared/reference/hyperparameters.md, section 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from distppo.config.fields import algorithm, execution, identity, output
from distppo.envs.games import AUTO, BACKENDS, NO_ALE_VIDEO, auto_backend, resolve_env_id
from distppo.envs.video import check_encoder
from distppo.errors import ConfigError

ALGOS = ("ppo", "ppo_lstm")
DEVICES = ("auto", "cpu", "cuda")
RUNNER_DEVICES = ("cpu", "cuda")
ACT_IN = ("auto", "runners", "learner")
AMP = ("off", "bf16")
MAX_SEED = 2**31 - 1


def flag_name(name: str) -> str:
    return name.replace("_", "-")


def positive(obj, name: str) -> None:
    value = getattr(obj, name)
    if not value > 0:
        raise ConfigError(f"--{flag_name(name)} must be > 0, got {value}")


def auto_or_positive(obj, name: str) -> None:
    value = getattr(obj, name)
    if value != "auto" and not (isinstance(value, int) and value > 0):
        raise ConfigError(f"--{flag_name(name)} must be auto or a number > 0, got {value!r}")


@dataclass(frozen=True)
class EnvConfig:
    env_id: str = identity("Breakout-v5", per_trial=True)
    """game id: `Breakout-v5` or `BreakoutNoFrameskip-v4` (any backend maps either), or a
    gymnasium vector-obs id such as CartPole-v1"""
    backend: str = identity(AUTO)
    """vector env implementation: auto (the experiment the id names: a NoFrameskip-v4 id runs
    CleanRL's ppo_atari.py on gym, a -v5 id ppo_atari_envpool.py on envpool, a vector-obs id
    gym; config.json records the one picked) | envpool (EnvPool, Linux) | gym (gymnasium +
    ale-py, SB3's Atari wrappers in Python, CleanRL's ppo_atari.py) | ale (ale-py's C++ vector
    env)"""
    num_envs: int = algorithm(8)
    """total number of parallel environments (summed over all env runners)"""
    capture_video: bool = output(False, resume=True)
    """record MP4 videos of env 0's full games to <run dir>/videos"""
    max_episode_steps: Optional[int] = algorithm(None)
    """Atari time limit per game in agent steps (4 frames each); a game cut by it is a done.
    Default: the reference script's, envpool 108,000 (EnvPool 0.6.6, ppo_atari_envpool's
    benchmark), gym 27,000 = the v4 ids' 108,000 frames (docs/semantics.md)"""

    def __post_init__(self) -> None:
        # `auto` is resolved here, once, so every reader of a config sees a backend of
        # BACKENDS (config.json records it). What was asked is kept beside it, outside the
        # fields: TrainConfig.replace resolves `auto` again for another env id.
        object.__setattr__(self, "_asked_backend", self.backend)
        if self.backend == AUTO:
            object.__setattr__(self, "backend", auto_backend(self.env_id))

    @property
    def asked_backend(self) -> str:
        """The backend asked for: `auto` or one of BACKENDS (a config unpickled from before
        `auto` existed: its backend, which was explicit)."""
        return self.__dict__.get("_asked_backend", self.backend)

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: use auto or one of "
                              f"{', '.join(BACKENDS)}")
        positive(self, "num_envs")
        resolved = resolve_env_id(self.env_id, self.backend)  # unknown or incompatible ids
        if self.max_episode_steps is not None:
            positive(self, "max_episode_steps")
            if resolved.kind != "atari":
                raise ConfigError(f"--max-episode-steps applies to Atari games only; "
                                  f"{self.env_id} keeps its own limit: drop the flag")
        if self.capture_video and self.backend == "ale":
            raise ConfigError(NO_ALE_VIDEO)
        if self.capture_video:
            check_encoder()


@dataclass(frozen=True)
class PPOConfig:
    algo: str = identity("ppo", per_trial=True)
    """ppo (Nature CNN, 4 stacked frames) | ppo_lstm (1 frame, LSTM(512 -> 128))"""
    total_timesteps: int = identity(10_000_000, resume=True)
    """total agent steps summed over envs (one agent step = 4 emulator frames on Atari)"""
    learning_rate: float = algorithm(2.5e-4)
    """Adam learning rate (eps 1e-5)"""
    num_steps: int = algorithm(128)
    """rollout length per env and iteration"""
    anneal_lr: bool = algorithm(True)
    """anneal the learning rate linearly towards 0 over the iterations"""
    gamma: float = algorithm(0.99)
    """discount factor"""
    gae_lambda: float = algorithm(0.95)
    """lambda of generalised advantage estimation"""
    num_minibatches: int = algorithm(4)
    """minibatches per epoch (LSTM: whole env sequences, num_envs / num_minibatches envs each)"""
    update_epochs: int = algorithm(4)
    """epochs over the batch per iteration"""
    norm_adv: bool = algorithm(True)
    """normalise advantages per minibatch"""
    clip_coef: float = algorithm(0.1)
    """surrogate clipping coefficient (policy and value)"""
    clip_vloss: bool = algorithm(True)
    """clip the value loss around the rollout-time value, as CleanRL's torch scripts do"""
    ent_coef: float = algorithm(0.01)
    """entropy bonus coefficient"""
    vf_coef: float = algorithm(0.5)
    """value loss coefficient"""
    max_grad_norm: float = algorithm(0.5)
    """global L2 norm to which gradients are clipped"""
    target_kl: Optional[float] = algorithm(None)
    """stop the epochs of an iteration early when approx_kl exceeds this (off by default)"""
    lstm_exact_resets: bool = algorithm(True)
    """ppo_lstm on envpool (next-step auto-reset): zero the LSTM state before the first
    observation of a new life and leave EnvPool's reset step out of the loss, as in the gym
    ordering; off = CleanRL's LSTM loop on EnvPool's ordering, unchanged (docs/semantics.md)"""

    exact_replay: bool = algorithm(False)
    """draw the random numbers CleanRL's script draws, in its order, so the run equals the
    script's own run scalar for scalar: actions from torch's global stream (seeded, then the
    initial weights), minibatches by np.random.shuffle in place on numpy's global seed, on
    CleanRL's layout and kernels (channels_last and the fused LSTM off, one gradient pass);
    on EnvPool without --max-episode-steps, the installed EnvPool's own time limit.
    The script is the experiment's: ppo + envpool ppo_atari_envpool.py, ppo + gym
    ppo_atari.py, ppo_lstm + gym ppo_atari_lstm.py. Needs --local, one env runner and a CPU
    learner (--no-cuda); off: each runner draws actions from its own stream (core/sampler.py)"""

    def validate(self) -> None:
        if self.algo not in ALGOS:
            raise ConfigError(f"unknown algo {self.algo!r}: use one of {', '.join(ALGOS)}")
        for name in ("total_timesteps", "learning_rate", "num_steps", "num_minibatches",
                     "update_epochs", "max_grad_norm"):
            positive(self, name)
        for name in ("clip_coef", "ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag_name(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"--{flag_name(name)} must lie in [0, 1], "
                                  f"got {getattr(self, name)}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ConfigError(f"--target-kl must be > 0 when given, got {self.target_kl}")


@dataclass(frozen=True)
class RunnerConfig:
    num_env_runners: int | Literal["auto"] = execution("auto", resume=True)
    """env-runner actors on the Ray path; the num_envs envs are split evenly across them. auto:
    one per 4 CPUs of the largest node, or with --runner-device cuda one per GPU of the cluster
    (the largest divisor of num_envs that fits; 1 on a node of up to 7 CPUs, in --local mode
    and in sweep trials), placement/sizing.py"""
    envs_per_runner: Optional[int] = execution(None, resume=True)
    """envs per env runner; when given, num_envs becomes num_env_runners * this"""
    runner_cpus: float = execution(1.0, resume=True)
    """CPUs Ray reserves per env runner (fractions allowed)"""
    num_threads: int | Literal["auto"] = execution("auto", resume=True)
    """torch intra-op threads per process: auto (the CPUs each process owns: --local all
    cores; Ray from the node's CPUs, split between runners and learners with --overlap,
    placement/sizing.py) or a number for every process, capped at the cores it may run on
    (recorded; decides bit-equality)"""
    omp_spincount: str = execution("10000", resume=True)
    """GNU OpenMP spin count (GOMP_SPINCOUNT) of torch's worker threads in the processes this
    command starts: how long an idle torch thread busy-waits before it sleeps. 10000: idle
    threads stop spinning on the cores EnvPool steps on (docs/benchmarks.md); `default`:
    libgomp's own (300,000, as CleanRL runs). Set before torch loads, by `distppo train` and
    `distppo sweep` for themselves and the local Ray they start; a GOMP_SPINCOUNT already in the
    environment wins, and on a cluster joined through RAY_ADDRESS the nodes' environment does"""
    malloc_reuse: bool = execution(True, resume=True)
    """glibc malloc keeps the memory torch frees for the next minibatch instead of returning it
    to the kernel and faulting it in again (mallopt: mmap threshold 1 GiB, 32 MiB on glibc <
    2.35, no trim), in every process of the run (core/threads.py); the learning is unchanged,
    the heap keeps its high-water mark. Off: glibc's own, as CleanRL runs. No effect off glibc"""
    overlap: bool = algorithm(False)
    """runners collect iteration k+1 with weights k while learners update on k (policy lag 1);
    off = CleanRL"""
    env_groups: int = execution(1)
    """each env runner's envs in this many groups, stepped alternately: one group's envs step
    (on their own thread) while the policy acts for the next group. Every env acts with the
    same weights and seeds as with 1 (the same experiment), but actions are drawn per group,
    so the random numbers are not CleanRL's; 1 = CleanRL's loop (core/sampler.py)"""
    runner_max_restarts: int = execution(3, resume=True)
    """times Ray restarts a dead env runner; its rollout is re-requested with the same weights"""
    runner_device: str = execution("cpu", resume=True)
    """device of the env runners' policy copies (rollout inference): cpu | cuda"""
    runner_gpus: float | Literal["auto"] = execution("auto", resume=True)
    """GPUs Ray reserves per env runner with --runner-device cuda, in (0, 1]: a number, or auto
    (0.25, less where the runners would take over half the cluster's GPUs: they share that
    half, and the learners with --learner-gpus auto the rest)"""
    act_in: str = execution("auto", resume=True)
    """which processes step the envs and act: runners (env-runner processes of their own, with
    a copy of the weights on --runner-device), learner (each learner process steps its share of
    the envs, one runner per learner, and acts with its own parameters: no weight copies; on a
    GPU learner that is single-process GPU acting), or auto: learner with --runner-device cuda
    where the learner is on a GPU, else runners (placement/sizing.py)"""

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
        auto_or_positive(self, "num_env_runners")
        if self.envs_per_runner is not None:
            positive(self, "envs_per_runner")
        positive(self, "runner_cpus")
        auto_or_positive(self, "num_threads")
        if self.omp_spincount != "default" and not self.omp_spincount.isdigit():
            raise ConfigError(f"--omp-spincount must be default or a number >= 0, got "
                              f"{self.omp_spincount!r}")
        if self.runner_device not in RUNNER_DEVICES:
            raise ConfigError(f"unknown runner device {self.runner_device!r}: use one of "
                              f"{', '.join(RUNNER_DEVICES)}")
        if self.runner_gpus != "auto" and not 0 < self.runner_gpus <= 1:
            raise ConfigError(f"--runner-gpus must lie in (0, 1], got {self.runner_gpus}")
        if self.act_in not in ACT_IN:
            raise ConfigError(f"unknown --act-in {self.act_in!r}: use one of {', '.join(ACT_IN)}")
        positive(self, "env_groups")
        if self.runner_max_restarts < 0:
            raise ConfigError(f"--runner-max-restarts must be >= 0, got {self.runner_max_restarts}")


@dataclass(frozen=True)
class LearnerConfig:
    cuda: bool = execution(True, resume=True)
    """use CUDA for the learner when a GPU is visible, as CleanRL's --cuda; --no-cuda keeps it
    on the CPU"""
    device: str = execution("auto", resume=True)
    """learner device: auto (follows --cuda) | cpu | cuda (requires a GPU: fails when none is
    visible)"""
    num_learners: int = execution(1)
    """data-parallel learner actors on the Ray path"""
    learner_gpus: float | Literal["auto"] = execution("auto", resume=True)
    """GPUs Ray reserves per learner: auto (1 when the cluster or machine has a GPU and the
    learner may use CUDA, else 0) or a number"""
    learner_cpus: float = execution(1.0, resume=True)
    """CPUs Ray reserves per learner"""
    channels_last: bool = execution(True, resume=True)
    """Nature CNN in channels_last memory layout (faster convolutions on CPU and GPU; float
    rounding differs from CleanRL's layout: --no-channels-last for bit-equal numbers)"""
    fused_lstm: bool = execution(True, resume=True)
    """PPO-LSTM's update runs the LSTM over each stretch between done steps in one nn.LSTM
    call (same numbers within float rounding); --no-fused-lstm: one call per time step, as
    ppo_atari_lstm.py"""
    compile: bool = execution(False, resume=True)
    """torch.compile the learner's model (same numbers within float rounding)"""
    grad_shards: int | Literal["auto"] = execution("auto", resume=True)
    """a CPU learner computes each minibatch's gradient as the sum of this many slices of it,
    side by side, each on a fixed number of torch threads (core/shards.py); with --overlap the
    slices run one by one while the runners sample and side by side once they have delivered,
    with the same numbers either way. auto: with --overlap's handover (a small node), one slice
    per thread the update may use, of at least 64 samples (PPO-LSTM: whole envs); otherwise 1.
    Always 1 on a GPU. 1: CleanRL's single pass. Same learning within float rounding
    (recorded)"""
    amp: str = execution("off")
    """mixed precision of the learner's update: off | bf16 (GPU only)"""
    cuda_graphs: bool = execution(False, resume=True)
    """PPO on a GPU: each minibatch step of the update (forward, loss, backward, clipping,
    capturable Adam) and, with --runner-device cuda, each env step's policy step run as
    captured CUDA graphs (core/captured.py). Same minibatches, same action distribution; the
    actions are drawn from the GPU's own random stream and Adam's rounding differs, so the
    numbers are not CleanRL's: opt-in. Where it has run: docs/benchmarks.md ("GPU")"""

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
        positive(self, "num_learners")
        positive(self, "learner_cpus")
        auto_or_positive(self, "grad_shards")
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
        if self.cuda_graphs:
            if self.device == "cpu" or not self.cuda:
                raise ConfigError("--cuda-graphs needs the learner on a GPU: drop --cuda-graphs "
                                  "or --device cpu/--no-cuda")
            for flag, on in (("--num-learners > 1", self.num_learners > 1),
                             ("--compile", self.compile), (f"--amp {self.amp}", self.amp != "off"),
                             ("--grad-shards > 1", self.grad_shards not in ("auto", 1))):
                if on:
                    raise ConfigError(f"--cuda-graphs does not combine with {flag}: drop one")


@dataclass(frozen=True)
class TrackConfig:
    track: bool = output(False)
    """log the run to Weights & Biases, as CleanRL's --track (the tracking extra;
    WANDB_MODE=offline writes the run locally)"""
    wandb_project_name: str = output("cleanRL")
    """the W&B project of --track"""
    wandb_entity: Optional[str] = output(None)
    """the W&B entity (team) of --track; default: your W&B user"""
    mlflow_tracking_uri: Optional[str] = output(None)
    """also log the run to MLflow at this tracking URI (file:///path/mlruns, http://host:5000),
    experiment --exp-name (a sweep: experiment --name)"""

    def validate(self) -> None:
        if not self.wandb_project_name:
            raise ConfigError("--wandb-project-name must not be empty")
        if self.mlflow_tracking_uri is not None and not self.mlflow_tracking_uri:
            raise ConfigError("--mlflow-tracking-uri must not be empty: give a URI or drop it")
