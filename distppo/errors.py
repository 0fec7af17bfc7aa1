"""Every error type distppo raises on purpose; the bottom of the import graph.

The CLI maps them to exits: UserError and ConfigError print one line and exit 2 (the user can
fix it), TrainingError prints one line and exits 1 (the run could not go on).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A mistake the user can fix (bad path, bad checkpoint); reported as one line, exit 2."""


class ConfigError(UserError, ValueError):
    """A user mistake in the configuration; the message is one line that says how to fix it."""


class TrainingError(RuntimeError):
    """Training could not go on (an env raised, a process kept dying); one line, exit 1."""


class EnvError(TrainingError):
    """An env raised inside a runner; the message names the env and the runner."""


class LearnerFailure(TrainingError):
    """A learner process died; the loop restores every learner from the last checkpoint."""


class JobEnded(TrainingError):
    """This process's Ray job ended (its driver died) and Ray is stopping the job's processes:
    an actor lost now died with the job, not of a fault, so it is neither recovered nor
    counted. The run stops where it is; the driver's --resume continues it."""


class RunnerFailure(TrainingError):
    """An env runner failed for good (an env raised, or restarts were used up)."""


class StorageError(TrainingError, OSError):
    """A run file could not be written (disk full, quota, read-only); one line, exit 1. The
    files already written stay whole, so the run resumes once there is room. Also an OSError,
    so code that handles I/O errors still sees one."""


def install_hint(extra: str) -> str:
    """The command that installs one of distppo's extras. distppo has no release on a public
    package index (a `pip install 'distppo[...]'` would fetch whatever is published under that
    name there), so every hint installs from the source checkout."""
    return f"pip install -e '.[{extra}]' in the distppo checkout (distppo is not on PyPI)"


def seconds_from_env(name: str, default: float) -> float:
    """A number of seconds from environment variable `name`, else `default`."""
    text = os.environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        raise UserError(f"{name}={text!r}: give a number of seconds") from None


def answered_within(request: Callable[[], T], seconds: float, silence: str) -> T:
    """request()'s result, or the error it raised, raised here; UserError(silence) when it has
    not answered within `seconds`. It runs in a helper thread while this one waits in short
    steps: a storage or server that does not answer ends in one line, and a signal (Ctrl-C,
    SIGTERM) is handled at once, whereas in this thread it would wait out a library's C++ call
    or its retries. A request given up on is left to end on its own (a daemon thread)."""
    done, out = threading.Event(), {}

    def call() -> None:
        try:
            out["value"] = request()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            out["error"] = exc
        done.set()

    threading.Thread(target=call, name="answered-within", daemon=True).start()
    deadline = time.monotonic() + seconds
    while not done.wait(0.1):
        if time.monotonic() > deadline:
            raise UserError(silence)
    if "error" in out:
        raise out["error"]
    return out["value"]


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `ray job stop`, a scheduler's preemption), handled as Ctrl-C is: the
    run stops where it is, its files stay whole, `--resume` continues it; exit 143."""


_SIGTERM = threading.Event()
# set where Ray is left in a state its C++ teardown at exit crashed in now and then (a stop
# that interrupted ray.init, a GCS that has stopped answering): the CLI then ends with os._exit
# once its line is out (Ray's processes are stopped or reaped: distributed/reaper.py)
end_now = threading.Event()


def end(code: int) -> int:
    """code; or, where end_now is set, this process ended with it at once (os._exit, after
    stdout and stderr are flushed)."""
    if end_now.is_set():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a closed pipe: nothing more to say there
                pass
        os._exit(code)
    return code


def sigterm_received() -> bool:
    """Whether SIGTERM arrived: Ray re-raises an exception raised by a handler while it waits
    (ray.get) as a bare KeyboardInterrupt, so the exception's type alone cannot tell."""
    return _SIGTERM.is_set()


def terminated() -> Terminated:
    """The Terminated of a SIGTERM that a handler other than ours took (ray.init's own)."""
    _SIGTERM.set()
    return Terminated()


def mark_resumable(exc: BaseException, resumable: bool) -> None:
    """Whether what a Ctrl-C or SIGTERM stopped can be continued with --resume (a run from its
    first row, a sweep once Tune saved its state); the CLI's line says --resume only then."""
    exc.distppo_resumable = resumable  # type: ignore[attr-defined]


def is_resumable(exc: BaseException) -> bool:
    return bool(getattr(exc, "distppo_resumable", False))


def stop_on_sigterm() -> None:
    """Make SIGTERM do what Ctrl-C does in this process: call the SIGINT handler installed
    now (Tune's graceful stop during a sweep) or raise Terminated. Without it Python dies at
    once, and after ray.init Ray's C++ core prints a stack dump first; so this is called at
    start and again after ray.init. Only the main thread can set a handler."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigterm(signum, frame):
        _SIGTERM.set()
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint) and on_sigint is not signal.default_int_handler:
            on_sigint(signal.SIGINT, frame)
        else:
            raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
