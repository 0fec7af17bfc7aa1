"""Per-iteration bookkeeping of the loop: phase timers and finished-game statistics."""
from __future__ import annotations

import collections
import contextlib
import math
import time
from typing import Iterator, Mapping, Sequence

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
