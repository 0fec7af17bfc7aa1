"""Console progress: one live line on a terminal, one plain line per update in logs and pipes."""
from __future__ import annotations

import math
import sys
from typing import Optional, TextIO


def format_eta(seconds: float) -> str:
    """h:mm:ss, or '-' when unknown (no throughput yet)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Training progress from (global_step, SPS, recent return).

    On a TTY the line is rewritten in place with '\\r'; elsewhere (log files, `ray job` output,
    CI) carriage returns pile up into one unreadable line, so each update is its own line.
    """

    def __init__(self, total_steps: int, stream: TextIO = sys.stdout,
                 tty: Optional[bool] = None) -> None:
        self.total_steps = int(total_steps)
        self.stream = stream
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty and isatty()) if tty is None else tty
        self._width = 0  # length of the live line, to blank out leftovers of a longer one

    def line(self, global_step: int, sps: float, recent_return: Optional[float]) -> str:
        pct = 100.0 * global_step / self.total_steps if self.total_steps else 0.0
        ret = "-" if recent_return is None or math.isnan(recent_return) else f"{recent_return:.2f}"
        eta = (self.total_steps - global_step) / sps if sps > 0 else math.nan
        return (f"step {global_step:,}/{self.total_steps:,} ({pct:5.1f}%) | SPS {sps:,.0f} | "
                f"return {ret} | ETA {format_eta(eta)}")

    def update(self, global_step: int, sps: float, recent_return: Optional[float]) -> None:
        text = self.line(global_step, sps, recent_return)
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the live line so whatever prints next starts on a fresh one."""
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0
