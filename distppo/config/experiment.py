"""Which experiment a config runs: the CleanRL script whose env set-up and loop it reproduces,
said in the first line `distppo train`, `sweep` and `plan` print.

The backend decides the experiment, not the id's spelling: the same game is another
experiment on EnvPool (next-step auto-reset, its C++ preprocessing, its time limit) than on
gymnasium + SB3's wrappers (docs/semantics.md).
"""
from __future__ import annotations

from distppo.envs.games import AUTO, resolve_env_id

# (env kind, algo, backend) -> the CleanRL script that runs that set-up
SCRIPTS = {("atari", "ppo", "gym"): "ppo_atari.py",
           ("atari", "ppo", "envpool"): "ppo_atari_envpool.py",
           ("atari", "ppo_lstm", "gym"): "ppo_atari_lstm.py",
           ("classic", "ppo", "gym"): "ppo.py"}
SETUPS = {"gym": "gymnasium + ale-py with SB3's Atari wrappers",
          "envpool": "EnvPool's C++ preprocessing, next-step auto-reset",
          "ale": "ale-py's C++ vector env with ppo_atari.py's episode semantics"}
# what --backend auto runs instead, to name the other experiment of the same game
OTHER = {"gym": "envpool", "envpool": "gym"}


def script(env_id: str, algo: str, backend: str) -> str:
    """`CleanRL's ppo_atari.py`, or why there is no CleanRL script to name."""
    kind = resolve_env_id(env_id, backend).kind
    name = SCRIPTS.get((kind, algo, backend))
    if name:
        return f"CleanRL's {name}"
    if backend == "ale":
        return "no CleanRL script (its env set-up differs: docs/semantics.md)"
    return f"no CleanRL script runs {algo} on {backend}"


def experiment_line(env_id: str, algo: str, backend: str, asked: str) -> str:
    """One run's experiment: the script, the game, the backend and who chose it."""
    kind = resolve_env_id(env_id, backend).kind
    setup = SETUPS[backend] if kind == "atari" else "gymnasium"
    line = f"experiment: {script(env_id, algo, backend)}: {env_id}, {algo} on {backend} ({setup})"
    if asked == AUTO and kind == "atari":
        other = OTHER.get(backend)
        line += f"; --backend auto chose {backend} for this id"
        if other:
            line += f", --backend {other} runs {script(env_id, algo, other)}"
    return line


def sweep_line(games: tuple[str, ...], algos: tuple[str, ...], backend_of, asked: str) -> str:
    """A sweep's experiments: per algo and backend, how many games and which script."""
    parts = []
    for algo in algos:
        groups: dict[tuple[str, str], list[str]] = {}
        for game in games:
            backend = backend_of(game)
            groups.setdefault((backend, script(game, algo, backend)), []).append(game)
        for (backend, what), ids in groups.items():
            parts.append(f"{algo} on {backend}, {len(ids)} game(s): {what}")
    chosen = " (--backend auto: per game id)" if asked == AUTO else ""
    return "experiments" + chosen + ": " + "; ".join(parts)
