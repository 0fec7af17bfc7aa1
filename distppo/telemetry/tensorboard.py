"""TensorBoard scalars of each iteration under CleanRL's tag names.

Written with tensorboardX, which needs only protobuf to write event files; the full
`tensorboard` package is needed only to view them (or, in the tests, to read them back).
torch.utils.tensorboard would import `tensorboard` just to write a file.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Iterable, Mapping, Optional

from distppo.telemetry.schema import LOSS_COLUMNS, PHASES

# TensorBoard scalar -> row column, with CleanRL's names (reference/hyperparameters.md section 6).
TB_SCALARS = {"charts/learning_rate": "learning_rate", "charts/SPS": "sps",
              **{f"losses/{c}": c for c in LOSS_COLUMNS},
              **{f"perf/t_{p}_s": f"t_{p}_s" for p in PHASES}}


def _quiet_full_disk(args: threading.ExceptHookArgs) -> None:
    """tensorboardX writes from a thread of its own; when the disk is full, that thread's
    OSError would print a traceback beside the run's one-line error (the loop's own writes
    hit the same disk and report it: telemetry/files.py). Other threads' errors print as
    before."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith(
            "tensorboardX"):
        return
    _PREVIOUS_HOOK(args)


_PREVIOUS_HOOK = threading.excepthook


class TensorBoardWriter:
    """CleanRL's TensorBoard scalars from one schema row, x-axis global_step."""

    def __init__(self, log_dir: str | os.PathLike, purge_step: Optional[int] = None) -> None:
        # Imported here so `import distppo.telemetry` stays light for the report.
        from tensorboardX import SummaryWriter
        threading.excepthook = _quiet_full_disk
        # purge_step: a resumed run hides the events its crashed predecessor wrote past the
        # checkpoint, so TensorBoard never shows two values for one step.
        # tensorboardX names event files by the second: a suffix in nanoseconds keeps a resume
        # (or a rewind) within the same second from overwriting the file before it, and sorts
        # the files in the order they were written, the order TensorBoard reads (and purges) in
        self._writer = SummaryWriter(str(log_dir), purge_step=purge_step,
                                     filename_suffix=f".{time.time_ns()}.{os.getpid()}")

    def write(self, row: Mapping, episodes: Optional[Iterable[tuple[float, float]]] = None) -> None:
        """Scalars of one iteration; `episodes` are this iteration's (return, length) pairs.

        CleanRL writes one point per finished game at the step it finished; we get the games
        per iteration, so each is written at the iteration's global_step.
        """
        step = int(row["global_step"])
        for ret, length in episodes or ():
            self._writer.add_scalar("charts/episodic_return", float(ret), step)
            self._writer.add_scalar("charts/episodic_length", float(length), step)
        for tag, column in TB_SCALARS.items():
            self._writer.add_scalar(tag, float(row[column]), step)

    def add_hparams_text(self, config: Mapping) -> None:
        """The "hyperparameters" text entry: a markdown table of every setting, as in CleanRL."""
        table = "\n".join(f"|{k}|{v}|" for k, v in flatten(config).items())
        self._writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        try:
            self._writer.close()
        except OSError:
            # A full disk: tensorboardX's exit hook would try this close again and print a
            # traceback under the run's one-line error. The events that did not fit are lost
            # either way, so mark the event files closed (tensorboardX has no public way).
            for file_writer in (self._writer.all_writers or {}).values():
                file_writer.event_writer._closed = True
            raise


def flatten(config: Mapping, prefix: str = "") -> dict:
    # Nested sections (TrainConfig.to_dict()) become dotted keys: env.num_envs, ppo.gamma, ...
    out = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
