"""TensorBoard scalars of each iteration under CleanRL's tag names.

Written with tensorboardX's event-file writer and summary protobufs, which need only protobuf;
the full `tensorboard` package is needed only to view the files (or, in the tests, to read them
back). torch.utils.tensorboard would import `tensorboard` just to write a file.

The events are written synchronously, not through SummaryWriter's background thread: its queue
cannot be drained on demand, so events a run had written before a checkpoint could still be in
the queue when the process was killed, and the resume (which starts after the checkpoint) never
wrote them again. `flush()` here makes everything written so far durable; the loop calls it
before each checkpoint.
"""
from __future__ import annotations

import os
import time
from typing import Iterable, Mapping, Optional

from distppo.telemetry.redact import redact_config
from distppo.telemetry.schema import LOSS_COLUMNS, PHASES

# TensorBoard scalar -> row column, with CleanRL's names (reference/hyperparameters.md section 6).
TB_SCALARS = {"charts/learning_rate": "learning_rate", "charts/SPS": "sps",
              **{f"losses/{c}": c for c in LOSS_COLUMNS},
              **{f"perf/t_{p}_s": f"t_{p}_s" for p in PHASES}}


class TensorBoardWriter:
    """CleanRL's TensorBoard scalars from one schema row, x-axis global_step."""

    def __init__(self, log_dir: str | os.PathLike, purge_step: Optional[int] = None) -> None:
        # tensorboardX names event files by the second: a suffix in nanoseconds keeps a resume
        # (or a rewind) within the same second from overwriting the file before it, and sorts
        # the files in the order they were written, the order TensorBoard reads (and purges) in
        # Imported here so `import distppo.telemetry` stays light for the report (tensorboardX
        # imports torch when it is installed).
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import scalar, text
        self._event, self._scalar_summary, self._text_summary = Event, scalar, text
        os.makedirs(log_dir, exist_ok=True)
        self._events = EventsWriter(os.path.join(os.fspath(log_dir), "events"),
                                    f".{time.time_ns()}.{os.getpid()}")
        if purge_step is not None:
            # A resumed run hides the events its crashed predecessor wrote past the checkpoint,
            # so TensorBoard never shows two values for one step (as SummaryWriter(purge_step)).
            self._events.write_event(Event(wall_time=time.time(), step=purge_step,
                                           session_log=SessionLog(status=SessionLog.START)))

    def write(self, row: Mapping, episodes: Optional[Iterable[tuple[float, float]]] = None,
              columns: Optional[Iterable[str]] = None) -> None:
        """Scalars of one iteration; `episodes` are this iteration's (return, length) pairs.
        `columns`: only the scalars of these row columns (default: all of TB_SCALARS).

        CleanRL writes one point per finished game at the step it finished; we get the games
        per iteration, so each is written at the iteration's global_step.
        """
        step = int(row["global_step"])
        for ret, length in episodes or ():
            self._scalar("charts/episodic_return", float(ret), step)
            self._scalar("charts/episodic_length", float(length), step)
        wanted = None if columns is None else set(columns)
        for tag, column in TB_SCALARS.items():
            if wanted is None or column in wanted:
                self._scalar(tag, float(row[column]), step)

    def add_hparams_text(self, config: Mapping) -> None:
        """The "hyperparameters" text entry: a markdown table of every setting, as in CleanRL."""
        table = "\n".join(f"|{k}|{v}|" for k, v in flatten(redact_config(config)).items())
        self._events.write_event(self._event(wall_time=time.time(), summary=self._text_summary(
            "hyperparameters", f"|param|value|\n|-|-|\n{table}")))

    def _scalar(self, tag: str, value: float, step: int) -> None:
        self._events.write_event(self._event(wall_time=time.time(), step=step,
                                             summary=self._scalar_summary(tag, value)))

    def flush(self) -> None:
        """Everything written so far reaches the disk (written and fsynced)."""
        self._events.flush()

    def close(self) -> None:
        # On a full disk the flush raises; the file is closed all the same (nothing retries
        # it at exit), and the events that did not fit are lost either way.
        self._events.close()


def flatten(config: Mapping, prefix: str = "") -> dict:
    # Nested sections (TrainConfig.to_dict()) become dotted keys: env.num_envs, ppo.gamma, ...
    out = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
