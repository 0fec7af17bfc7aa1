"""The one place distppo starts or joins Ray (`distppo train`, sweep trials, the launch script).

RAY_ADDRESS set (a cluster, `ray job submit`, a test's session cluster): join it. Otherwise
start a private single-node Ray on this machine, sized to at least `min_cpus`, watched by
distributed/reaper.py so that none of its processes outlives this one, even after a SIGKILL.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Optional, TypeVar

import ray

from distppo.distributed import reaper
from distppo.errors import end_now, stop_on_sigterm, terminated
from distppo.testing import faults


class _QuietOwnClusterAuth(logging.Filter):
    """Ray (2.52+) warns on every new local cluster that it turned token authentication on,
    its secure default: a WARNING line before each run's first line for a Ray the user never
    chose. Dropped for the private Ray started here (docs/quickstart.md says it once); a
    cluster the user starts or joins is left to say everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled" not in record.getMessage()


T = TypeVar("T")
SHUTDOWN_WAIT_S = 15.0  # a ray.shutdown after a stop halfway through ray.init, at most

RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_QUIET_AUTH = _QuietOwnClusterAuth()  # one instance: addFilter keeps it once


def connect(min_cpus: float = 0.0, dashboard: bool = False) -> None:
    """Join RAY_ADDRESS or start a local Ray; quiet, so errors stay one line. Idempotent."""
    if ray.is_initialized():
        return
    kwargs: dict = {"log_to_driver": False, "logging_level": logging.WARNING}
    forwarded = faults.forwarded_env()
    if forwarded:  # fault-injection tests reach the job's workers this way (testing/faults.py)
        kwargs["runtime_env"] = {"env_vars": forwarded}
    if not os.environ.get("RAY_ADDRESS"):
        kwargs["address"] = "local"  # a new Ray even where another one runs on this machine
        kwargs["include_dashboard"] = dashboard
        kwargs["num_cpus"] = max(os.cpu_count() or 1, int(min_cpus + 0.999))
        logging.getLogger(RAY_AUTH_LOGGER).addFilter(_QUIET_AUTH)
        reaper.watch()
    try:
        ray.init(**kwargs)
    except (KeyboardInterrupt, SystemExit) as exc:
        # stopped halfway: this process is to end without Ray's C++ teardown (errors.end_now),
        # which then crashed it now and then (SIGSEGV after the stop's line, no Python frame
        # in it); Ray's half-started processes are stopped now (a second signal meanwhile
        # cuts that short, not the line that reports the first)
        end_now.set()
        stop_on_sigterm()
        answer_within(SHUTDOWN_WAIT_S, _shutdown_quietly)  # what it leaves: reaper.py
        if isinstance(exc, SystemExit):
            # ray.init exits only from the SIGTERM handlers it installs while it starts (the
            # signal's number, or 1 once its node is up): that stop is ours to report
            raise terminated() from None
        raise
    stop_on_sigterm()  # ray.init put Ray's stack-dumping handler in its place


def _shutdown_quietly() -> None:
    try:
        ray.shutdown()
    except BaseException:  # noqa: BLE001 - the first stop is the one to report
        pass


def answer_within(seconds: float, ask: Callable[[], T]) -> Optional[T]:
    """ask() on a daemon thread; its answer if it comes within `seconds`, else None (the
    thread is left running: a call into Ray that waits on its GCS cannot be cancelled)."""
    answers: list[T] = []
    thread = threading.Thread(target=lambda: answers.append(ask()), daemon=True,
                              name="distppo-bounded-call")
    thread.start()
    thread.join(seconds)
    return answers[0] if answers else None
