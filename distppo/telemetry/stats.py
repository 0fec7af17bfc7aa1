"""Per-iteration bookkeeping of the loop: phase timers and finished-game statistics."""
from __future__ import annotations

import collections
import contextlib
import math
import time
from typing import Iterator, Mapping, Optional, Sequence

from distppo.telemetry.schema import PHASES


class PhaseTimer:
    """Always-on wall timers per phase (DESIGN.md 4.9); perf_counter costs under a microsecond."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._check(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        """Add seconds measured elsewhere (a remote runner reports its own env time)."""
        self._check(name)
        self.totals[name] = self.totals.get(name, 0.0) + float(seconds)

    def reset(self) -> None:
        self.totals.clear()

    def as_columns(self) -> dict[str, float]:
        """Every declared phase as its t_<phase>_s column; phases not timed are 0."""
        return {f"t_{p}_s": self.totals.get(p, 0.0) for p in PHASES}

    @staticmethod
    def _check(name: str) -> None:
        # A typo would otherwise time into a column that never reaches the file.
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: use one of {', '.join(PHASES)}")


class EpisodeTracker:
    """Finished-game statistics; the last-100 mean is CleanRL's benchmark definition."""

    def __init__(self, window: int = 100) -> None:
        self.returns: collections.deque[float] = collections.deque(maxlen=window)

    def add(self, returns: Sequence[float], lengths: Sequence[float]) -> dict:
        """Record this iteration's games; returns their four episode columns for the row."""
        if len(returns) != len(lengths):
            raise ValueError(f"{len(returns)} returns but {len(lengths)} lengths")
        self.returns.extend(float(r) for r in returns)
        n = len(returns)
        return {
            "episodic_return_mean": math.fsum(returns) / n if n else math.nan,
            "episodic_length_mean": math.fsum(lengths) / n if n else math.nan,
            "episodes": n,
            "episodic_return_last100": self.last100_mean(),
        }

    def last100_mean(self) -> float:
        return math.fsum(self.returns) / len(self.returns) if self.returns else math.nan

    def state_dict(self) -> dict:
        """For checkpoints, so a resumed run's last-100 mean continues where it stopped."""
        return {"returns": list(self.returns)}

    def load_state_dict(self, state: Mapping) -> None:
        self.returns.clear()
        self.returns.extend(state["returns"])


class ReferenceReturns:
    """The return statistics CleanRL's EnvPool benchmarks published, computed from our games,
    so a run sits beside those numbers like for like (docs/semantics.md, docs/report.md).

    - ppo_atari_envpool.py: at each game it logs (its own rule: atari_envpool.py), it writes
      `charts/avg_episodic_return` = the mean of the last 20 such games; openrlbenchmark's
      number for a run is the mean of the last 100 values written.
    - ppo_atari_envpool_xla_jax.py: once per iteration, the mean over envs of each env's latest
      finished game (0 for an env without one yet); the run's number is the mean of the last
      100 iterations' values.
    """

    def __init__(self, num_envs: int) -> None:
        self.avg20: collections.deque[float] = collections.deque(maxlen=20)
        self.envpool_values: collections.deque[float] = collections.deque(maxlen=100)
        self.latest = [0.0] * num_envs
        self.xla_values: collections.deque[float] = collections.deque(maxlen=100)

    def add(self, games: Sequence[tuple[int, float]],
            envpool_logged: Optional[Sequence[float]]) -> dict:
        """One iteration: its finished games as (env index over all runners, return) in the
        order they ended, and the returns ppo_atari_envpool.py would have logged (None when
        the backend is not EnvPool). Returns the row's two reference columns."""
        for env, ret in games:
            self.latest[env] = float(ret)
        self.xla_values.append(math.fsum(self.latest) / len(self.latest))
        for ret in envpool_logged or ():
            self.avg20.append(float(ret))
            self.envpool_values.append(math.fsum(self.avg20) / len(self.avg20))
        envpool = (math.fsum(self.envpool_values) / len(self.envpool_values)
                   if envpool_logged is not None and self.envpool_values else math.nan)
        return {"envpool_avg_return_last100": envpool,
                "xla_avg_return_last100": math.fsum(self.xla_values) / len(self.xla_values)}

    def state_dict(self) -> dict:
        return {"avg20": list(self.avg20), "envpool_values": list(self.envpool_values),
                "latest": list(self.latest), "xla_values": list(self.xla_values)}

    def load_state_dict(self, state: Mapping) -> None:
        for key in ("avg20", "envpool_values", "xla_values"):
            getattr(self, key).clear()
            getattr(self, key).extend(state.get(key, ()))
        if len(state.get("latest", ())) == len(self.latest):
            self.latest = list(state["latest"])
