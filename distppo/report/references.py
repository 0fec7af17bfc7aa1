"""CleanRL / openrlbenchmark reference numbers (package data), joined to our env ids.

The files are copies of `../shared/reference/` (see its README): `runtimes.csv` (minutes per
game, seed mean, 10M steps), `returns.csv` (return mean and population std over seeds) and
`hns.csv` (random and human scores). Rows are labelled with the env id printed in the source
doc, v5 or NoFrameskip-v4; both our ids and theirs are mapped to the v5 form through
envs/games.py before joining, so either spelling finds the same row.

Our returns.csv adds one column to the copy, `statistic`: which return statistic the number
is (STATISTICS below, from the reference README's "Return metric" note and the scripts), so
the report sets each reference beside our run's number of the same statistic; PAIRING says
which references are the same experiment as a run of ours.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Optional, Sequence

import pandas as pd

from distppo.config import SweepConfig
from distppo.envs.games import ATARI_57, to_gym, to_v5
from distppo.errors import UserError

REFERENCE_STEPS = 10_000_000  # every reference run trained 10M agent steps (40M frames)

# The CleanRL script whose runs match ours most closely, by (algo, backend).
# CleanRL has no EnvPool LSTM script: ppo_lstm on EnvPool is set beside the gym LSTM one,
# labelled "no CleanRL counterpart" (pairing_note).
MATCHING_SCRIPT = {("ppo", "gym"): "ppo_atari", ("ppo_lstm", "gym"): "ppo_atari_lstm",
                   ("ppo", "envpool"): "ppo_atari_envpool",
                   ("ppo_lstm", "envpool"): "ppo_atari_lstm"}
# What each reference run set was: (algo, backend) in our terms, and anything else that makes
# it another experiment than our run with the same algo and backend (hyperparameters.md).
REFERENCE_SETUP = {
    "ppo_atari": ("ppo", "gym", None),
    "ppo_atari_lstm": ("ppo_lstm", "gym", None),
    "ppo_atari_envpool": ("ppo", "envpool", None),
    "ppo_atari_multigpu": ("ppo", "gym", "2 processes x 4 envs, returns of rank 0's envs only"),
    "ppo_atari_envpool_xla_jax": ("ppo", "envpool",
                                  "JAX: no value-loss clipping, population-std advantages"),
    "ppo_atari_envpool_xla_jax_scan": ("ppo", "envpool",
                                       "JAX: no value-loss clipping, population-std advantages"),
    "baselines_ppo2_cnn": ("ppo", "gym", "openai/baselines PPO2, another code base"),
    "baselines_ppo2_lstm": ("ppo_lstm", "gym", "openai/baselines PPO2, another code base"),
}
NO_COUNTERPART = ("ppo_lstm", "envpool")


@dataclass(frozen=True)
class Statistic:
    key: str         # returns.csv `statistic`
    label: str       # the words in a table heading or header
    ours: str        # our trials.parquet column computed the same way
    definition: str  # one sentence for the notes under the table


STATISTICS = {s.key: s for s in (
    Statistic("last100_games", "last 100 games", "final_episodic_return",
              "mean raw score of the run's last 100 finished games (a game ends at game over "
              "or at the time limit): `charts/episodic_return`, openrlbenchmark's last-100 "
              "window"),
    Statistic("envpool_avg20", "ppo_atari_envpool's avg_episodic_return", "final_envpool_return",
              "mean of the last 100 values of ppo_atari_envpool.py's `charts/avg_episodic_return`"
              ", the mean of the last 20 games it logged; it logs a game at a done with lives == "
              "0 and sums its score until a true game over, so a game cut by the time limit with "
              "lives left is not logged and its score runs on into the next one"),
    Statistic("xla_latest_per_env", "ppo_atari_envpool_xla_jax's avg_episodic_return",
              "final_xla_return",
              "mean over the last 100 iterations of ppo_atari_envpool_xla_jax.py's "
              "`charts/avg_episodic_return`, the mean over envs of each env's latest finished "
              "game (0 before its first)"),
    Statistic("unstated", "average return, aggregation not stated", "final_episodic_return",
              "a hand-typed table in docs/rl-algorithms/ppo.md that says 'average episodic "
              "returns' without the window; set beside our last-100-games mean"),
)}
# The two reference columns that cover all 57 games (the 57-game CleanRL tables).
FULL_COVERAGE = ("ppo_atari_envpool_xla_jax", "baselines_ppo2_cnn")

_ATARI_IDS = frozenset(ATARI_57) | frozenset(to_gym(g) for g in ATARI_57)


def is_atari(env_id: str) -> bool:
    return env_id in _ATARI_IDS


def game_key(env_id: str) -> str:
    """The join key: the v5 id for an Atari-57 game, the id itself otherwise."""
    return to_v5(env_id) if is_atari(env_id) else env_id


def game_order(env_ids: Sequence[str]) -> list[str]:
    """Atari games in the 57-game table order, then any other ids alphabetically."""
    rank = {g: i for i, g in enumerate(ATARI_57)}
    return sorted(set(env_ids), key=lambda e: (rank.get(game_key(e), len(rank)), e))


def _csv(name: str) -> pd.DataFrame:
    with resources.files("distppo").joinpath("data", name).open() as f:
        return pd.read_csv(f)


def _canonical(df: pd.DataFrame, own_doc: str) -> pd.DataFrame:
    """One row per (algo, game): the algo's own benchmark doc wins, else the first listed.

    The same run set is copied into several docs (reference README); `own_doc` is the doc
    named after the algo, e.g. docs/benchmark/ppo_atari_runtimes.md for ppo_atari.
    """
    df = df.assign(game=[game_key(e) for e in df["env_id"]], _order=range(len(df)))
    own = df["source_doc"] == df["algo"].map(lambda a: own_doc.format(algo=a))
    df = df.assign(_own=~own).sort_values(["_own", "_order"])
    return df.drop_duplicates(["algo", "game"]).sort_values("_order").drop(
        columns=["_own", "_order"]).reset_index(drop=True)


@lru_cache(maxsize=None)
def runtimes() -> pd.DataFrame:
    """algo, env_id, minutes, source_doc, game: one row per (algo, game)."""
    return _canonical(_csv("runtimes.csv"), "docs/benchmark/{algo}_runtimes.md")


@lru_cache(maxsize=None)
def returns() -> pd.DataFrame:
    """algo, env_id, mean, std, source_doc, game: one row per (algo, game)."""
    return _canonical(_csv("returns.csv"), "docs/benchmark/{algo}.md")


@lru_cache(maxsize=None)
def hns_table() -> dict[str, tuple[float, float]]:
    """v5 id -> (random score, human score)."""
    df = _csv("hns.csv")
    return {game_key(e): (float(r), float(h))
            for e, r, h in zip(df["env"], df["random"], df["human"])}


def names() -> list[str]:
    """Every reference name, in first-appearance order over runtimes.csv then returns.csv."""
    seen = list(dict.fromkeys(list(runtimes()["algo"]) + list(returns()["algo"])))
    return seen


def check_names(requested: Sequence[str]) -> list[str]:
    """The requested names, or a UserError that lists the valid ones."""
    valid = names()
    bad = [n for n in requested if n not in valid]
    if bad:
        raise UserError(f"unknown reference {', '.join(map(repr, bad))}: choose from "
                        f"{', '.join(valid)}")
    return list(dict.fromkeys(requested))


def default_names(sections: Sequence[tuple[str, str]]) -> list[str]:
    """The matching CleanRL script of each (algo, backend), then the two 57-game columns."""
    picked = [MATCHING_SCRIPT[s] for s in sections if s in MATCHING_SCRIPT]
    return list(dict.fromkeys(picked + list(FULL_COVERAGE)))


@dataclass(frozen=True)
class RefRuntime:
    minutes: float
    source_doc: str


@dataclass(frozen=True)
class RefReturn:
    mean: float
    std: float
    source_doc: str
    statistic: str   # a key of STATISTICS


def runtime(name: str, env_id: str) -> Optional[RefRuntime]:
    df = runtimes()
    hit = df[(df["algo"] == name) & (df["game"] == game_key(env_id))]
    if hit.empty:
        return None
    return RefRuntime(float(hit["minutes"].iloc[0]), hit["source_doc"].iloc[0])


def episodic_return(name: str, env_id: str) -> Optional[RefReturn]:
    df = returns()
    hit = df[(df["algo"] == name) & (df["game"] == game_key(env_id))]
    if hit.empty:
        return None
    row = hit.iloc[0]
    return RefReturn(float(row["mean"]), float(row["std"]), row["source_doc"], row["statistic"])


def return_statistic(name: str) -> Statistic:
    """The statistic of a reference's return column (its canonical rows share one)."""
    df = returns()
    keys = set(df.loc[df["algo"] == name, "statistic"])
    if len(keys) > 1:  # a broken package data file, not a user error
        raise RuntimeError(f"returns.csv gives {name} several statistics: {sorted(keys)}")
    return STATISTICS[keys.pop() if keys else "last100_games"]


def pairing_note(algo: str, backend: str, name: str) -> Optional[str]:
    """None when reference `name` is the same experiment as our (algo, backend) run at
    CleanRL's defaults, else why not, in a few words."""
    ref_algo, ref_backend, other = REFERENCE_SETUP.get(name, (None, None, "unknown setup"))
    diffs = []
    if ref_algo != algo and ref_algo is not None:
        diffs.append("an LSTM run" if ref_algo == "ppo_lstm" else "a feed-forward run")
    if ref_backend != backend and ref_backend is not None:
        diffs.append(f"a {ref_backend} run")
    if other:
        diffs.append(other)
    if (algo, backend) == NO_COUNTERPART:
        return ("no CleanRL counterpart: CleanRL has no EnvPool PPO-LSTM script"
                + (f"; {name} is " + ", ".join(diffs) if diffs else ""))
    return "not the same experiment: " + "; ".join(diffs) if diffs else None

def source_docs(name: str) -> dict[str, list[str]]:
    """Which docs a reference name's runtime and return numbers come from."""
    return {kind: sorted(set(df.loc[df["algo"] == name, "source_doc"]))
            for kind, df in (("runtimes", runtimes()), ("returns", returns()))}


def reference_minutes(sweep: SweepConfig) -> tuple[list, str]:
    """([minutes of each grid point of the sweep], how they were made) from runtimes.csv: the
    CleanRL script matching the algo and backend, per game where it lists the game, else the
    mean of the games it lists; scaled to the sweep's steps. `distppo plan` without a
    measurement."""
    steps = sweep.train.ppo.total_timesteps
    table = runtimes()
    per_pair, notes = {}, []
    # a sweep's trials of one algo may run on two backends (auto: per game id)
    pairs = dict.fromkeys((algo, sweep.backend_of(g)) for algo in sweep.algos for g in sweep.games)
    for algo, backend in pairs:
        name = MATCHING_SCRIPT.get((algo, backend))
        rows = table[table["algo"] == name]
        if rows.empty:
            raise UserError(f"no measurement and no CleanRL reference runtime for {algo} on "
                            f"{backend}: pass --from-sweep DIR or --from-bench FILE")
        known = dict(zip(rows["game"], rows["minutes"]))
        mean = float(rows["minutes"].mean())
        per_pair[algo, backend] = (known, mean)
        games = [g for g in sweep.games if sweep.backend_of(g) == backend]
        hits = sum(game_key(g) in known for g in games)
        notes.append(f"{algo} on {backend}: {name} ({hits} of {len(games)} games listed, the "
                     f"rest at their mean {mean:.1f} min)")
    minutes = []
    for env_id, algo, _ in sweep.grid():
        known, mean = per_pair[algo, sweep.backend_of(env_id)]
        base = float(known.get(game_key(env_id), mean))
        minutes.append(base * steps / REFERENCE_STEPS)
    return minutes, (
        "NO MEASUREMENT: CleanRL's reference minutes per 10M steps (runtimes.csv), scaled to "
        f"{steps:,} steps; " + "; ".join(notes) + "; CleanRL's hardware, one GPU per run")
