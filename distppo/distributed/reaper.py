"""Nothing of a run outlives it: a watchdog for the local Ray that a driver starts.

Ray ties its daemons to the driver that started them (PR_SET_PDEATHSIG), and its workers exit
when their raylet is gone, but the dashboard and runtime-env agents that the raylet starts
only poll their parent, then try to report to the dead GCS: after a SIGKILL of the driver
they live on, well past the driver. Nothing inside the driver can act on its own SIGKILL, so
`watch()` starts this module as a separate process that:

- holds the read end of a pipe whose only write end is the driver's: it reads EOF exactly
  when the driver is gone, however it ended (exit, exception, SIGKILL, OOM kill);
- meanwhile records, every POLL_S, every descendant of the driver (pid and start time: a
  pid reused later by an unrelated process is never touched);
- at EOF terminates the recorded processes still alive (SIGTERM, then SIGKILL after
  GRACE_S) and exits.

On a normal exit `ray.shutdown()` has already stopped Ray and the watchdog finds nothing left.
Only a Ray started by this process is watched; a joined cluster (RAY_ADDRESS) is not ours.
Run as `python -m distppo.distributed.reaper <driver pid>`; Ray-free on purpose.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys

POLL_S = 0.5
GRACE_S = 2.0
_watchers: list = []  # keeps the Popen (and so the pipe's write end) alive in the driver


def watch() -> None:
    """Start the watchdog of this process's descendants (call right after starting Ray)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "distppo.distributed.reaper", str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        # its own session: a Ctrl-C or kill of the driver's process group must not take the
        # watchdog down before it has cleaned up
        start_new_session=True)
    _watchers.append(proc)


def main(driver_pid: int) -> None:
    import psutil
    me = os.getpid()
    seen: dict[int, psutil.Process] = {}
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return
    while not _eof(sys.stdin.fileno(), POLL_S):
        try:
            for child in driver.children(recursive=True):
                if child.pid != me:
                    seen.setdefault(child.pid, child)
        except psutil.Error:
            break
    left = [p for p in seen.values() if p.is_running()]  # is_running checks the start time
    for proc in left:
        _signal(proc, "terminate")
    _, alive = psutil.wait_procs(left, timeout=GRACE_S)
    for proc in alive:
        _signal(proc, "kill")
    psutil.wait_procs(alive, timeout=GRACE_S)


def _eof(fd: int, timeout: float) -> bool:
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable) and os.read(fd, 4096) == b""


def _signal(proc, how: str) -> None:
    import psutil
    try:
        getattr(proc, how)()
    except psutil.Error:
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]))
