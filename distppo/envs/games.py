"""Game facts and env-id resolution: the only place that knows game names.

Atari games have two id forms that mean the same emulator set-up:
`Breakout-v5` (EnvPool) and `BreakoutNoFrameskip-v4` (gymnasium + ale-py, CleanRL's gym
scripts). Either form works with any backend; `resolve_env_id` maps it to the id the chosen
backend constructs (ale-py's vector env takes `ALE/Breakout-v5`). Backend `auto` picks the
backend of the CleanRL script that uses the form (`auto_backend`). Vector-observation
("classic") ids run the MLP path on the gym backend.
"""
from __future__ import annotations

import csv
import difflib
import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Optional, Sequence

from distppo.errors import ConfigError, install_hint

# Vector env implementations (envs/factory.py builds them): EnvPool, gymnasium + ale-py with
# the DeepMind wrappers in Python, ale-py's own C++ vector env.
BACKENDS = ("envpool", "gym", "ale")
# The backend a config may ask for: one of BACKENDS, or AUTO, which picks the one of the
# experiment the env id names (auto_backend) when the config is built.
AUTO = "auto"

NO_ALE_VIDEO = ("videos need --backend envpool or gym: ale-py's vector env renders no frames; "
                "drop --capture-video / --video")
# The emulator package of the Atari backends; EnvPool has Linux wheels only (pyproject markers).
BACKEND_MODULES = {"envpool": "envpool", "ale": "ale_py"}


def check_backend_installed(backend: str, asked: str = "") -> None:
    """Before a run starts: the backend's emulator package is importable (a one-line fix).
    `asked`: the --backend given, when it differs (auto), so the line says where it came from."""
    module = BACKEND_MODULES.get(backend)
    if module and importlib.util.find_spec(module) is None:
        hint = ("EnvPool publishes wheels for Linux only: pass --backend ale (ale-py's C++ "
                "vector env) or gym" if module == "envpool" else install_hint("train"))
        which = (f"--backend {asked} picked {backend}, which" if asked and asked != backend
                 else f"--backend {backend}")
        raise ConfigError(f"{which} needs the {module} package, which is not installed: {hint}")


# Our own POMDP: CartPole-v1 without the two velocity entries (see classic.py).
CARTPOLE_NO_VEL = "CartPoleNoVel-v1"


def _data_text(name: str) -> str:
    return resources.files("distppo").joinpath("data", name).read_text()


def _load_atari57() -> tuple[tuple[str, ...], dict[str, str]]:
    games = tuple(line.strip() for line in _data_text("atari57.txt").splitlines() if line.strip())
    rows = csv.DictReader(_data_text("atari57_gym.csv").splitlines())
    v5_to_gym = {row["envpool_id"]: row["gym_id"] for row in rows}
    missing = set(games) - set(v5_to_gym)
    if missing:  # a broken package data file, not a user error
        raise RuntimeError(f"atari57_gym.csv lacks {sorted(missing)}")
    return games, v5_to_gym


ATARI_57, _V5_TO_GYM = _load_atari57()
_GYM_TO_V5 = {g: v for v, g in _V5_TO_GYM.items()}


def to_v5(env_id: str) -> str:
    """`BreakoutNoFrameskip-v4` or `Breakout-v5` -> `Breakout-v5`."""
    if env_id in _V5_TO_GYM:
        return env_id
    if env_id in _GYM_TO_V5:
        return _GYM_TO_V5[env_id]
    raise _unknown(env_id)


def to_gym(env_id: str) -> str:
    """`Breakout-v5` or `BreakoutNoFrameskip-v4` -> `BreakoutNoFrameskip-v4`."""
    return _V5_TO_GYM[to_v5(env_id)]


def auto_backend(env_id: str) -> str:
    """The backend of the CleanRL experiment an id names: a `*NoFrameskip-v4` id is
    ppo_atari.py's (gymnasium + ale-py, SB3's Atari wrappers: gym), a `-v5` id
    ppo_atari_envpool.py's (envpool), a vector-observation id ppo.py's (gym)."""
    if env_id in _V5_TO_GYM:
        return "envpool"
    if env_id in _GYM_TO_V5 or env_id in classic_ids():
        return "gym"
    raise _unknown(env_id)


def resolve_backend(env_id: str, backend: str) -> str:
    """`backend`, with AUTO replaced by auto_backend(env_id); an explicit one wins."""
    return auto_backend(env_id) if backend == AUTO else backend


@dataclass(frozen=True)
class ResolvedEnv:
    kind: str        # 'atari' | 'classic'
    v5_id: str       # Atari: EnvPool id; classic: the gymnasium id (there is only one form)
    gym_id: str      # Atari: NoFrameskip-v4 id; classic: the gymnasium id
    backend_id: str  # the id the chosen backend constructs


def resolve_env_id(env_id: str, backend: str) -> ResolvedEnv:
    """Map a user env id to what `backend` builds; ConfigError with a one-line fix otherwise."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if env_id in _V5_TO_GYM or env_id in _GYM_TO_V5:
        v5, gym_id = to_v5(env_id), to_gym(env_id)
        built = {"envpool": v5, "gym": gym_id, "ale": f"ALE/{v5}"}[backend]
        return ResolvedEnv("atari", v5, gym_id, built)
    if env_id in classic_ids():
        if backend != "gym":
            raise ConfigError(f"{env_id} is a vector-observation env that only the gym backend "
                              "runs: use --backend gym")
        return ResolvedEnv("classic", env_id, env_id, env_id)
    raise _unknown(env_id)


@functools.lru_cache(maxsize=None)
def classic_ids() -> tuple[str, ...]:
    """Registered gymnasium ids with a 1-D Box observation and Discrete actions, plus ours.

    Found by building each non-Atari registered env once (cached): spaces are
    only known after construction. Envs whose dependencies are missing are skipped.
    """
    import gymnasium as gym

    found = [CARTPOLE_NO_VEL]
    for env_id, spec in gym.registry.items():
        entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
        if spec.namespace or entry.startswith("ale_py"):
            continue
        try:
            with warnings.catch_warnings():  # "out of date version" notices for old ids
                warnings.simplefilter("ignore")
                env = gym.make(env_id, disable_env_checker=True)
        except Exception:  # missing optional dependency (mujoco, box2d, ...): not usable here
            continue
        obs_space, act_space = env.observation_space, env.action_space
        env.close()
        if (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
                and isinstance(act_space, gym.spaces.Discrete)):
            found.append(env_id)
    return tuple(found)


def _unknown(env_id: str) -> ConfigError:
    candidates = list(_V5_TO_GYM) + list(_GYM_TO_V5) + list(classic_ids())
    scored = sorted(((difflib.SequenceMatcher(None, env_id, c).ratio(), c) for c in candidates),
                    reverse=True)
    # Near-ties only, so a typo names its game rather than every loosely similar one.
    best = scored[0][0]
    close: list[str] = []
    for score, cand in scored[:3]:
        if score < max(0.6, best - 0.1):
            break
        # Name both forms of an Atari game: the user may want either backend's spelling.
        pair = (to_v5(cand), to_gym(cand)) if cand in _V5_TO_GYM or cand in _GYM_TO_V5 else (cand,)
        close += [c for c in pair if c not in close]
    hint = f"did you mean {', '.join(close)}?" if close else (
        "use an Atari-57 id such as Breakout-v5 / BreakoutNoFrameskip-v4 or a classic id such "
        "as CartPole-v1")
    return ConfigError(f"unknown env id {env_id!r}: {hint}")


def expand_games(values: Sequence[str]) -> tuple[str, ...]:
    """`atari57`, env ids and files with one id per line (`#` comments) -> ids, first seen first."""
    out: list[str] = []
    for value in values:
        if value == "atari57":
            out += ATARI_57
        elif os.path.isfile(value):
            with open(value) as f:
                out += [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
        else:
            out.append(value)
    return tuple(dict.fromkeys(out))


# Atari time limit in agent steps when --max-episode-steps is not given: what the reference
# script of each backend had (docs/semantics.md). ppo_atari_envpool's benchmark ran EnvPool
# 0.6.6 (CleanRL's poetry.lock at PR #424), registered with 108,000 *agent steps*; EnvPool
# 0.8.2 changed the default to 27,000 (sail-sg/envpool#250). The gym scripts' v4 ids stop
# after 108,000 emulator frames = 27,000 agent steps, and so does ale-py's vector env.
DEFAULT_MAX_EPISODE_STEPS = {"envpool": 108_000, "gym": 27_000, "ale": 27_000}


def installed_envpool_limit(env_id: str) -> int:
    """The time limit (agent steps) the installed EnvPool gives a pool made without
    max_episode_steps, as CleanRL's ppo_atari_envpool.py makes it (27,000 on EnvPool 1.x,
    108,000 on the 0.6.6 of CleanRL's benchmark)."""
    import envpool
    return int(envpool.make_spec(resolve_env_id(env_id, "envpool").v5_id)
               .config.max_episode_steps)


def episode_limit(env_id: str, backend: str, requested: Optional[int] = None) -> Optional[int]:
    """The Atari time limit in agent steps a run uses; None for vector-observation envs."""
    if resolve_env_id(env_id, backend).kind != "atari":
        return None
    return requested if requested is not None else DEFAULT_MAX_EPISODE_STEPS.get(backend)
