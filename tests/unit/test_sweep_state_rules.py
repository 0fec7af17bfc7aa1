"""sweep/states.py's rules, each on the facts that decide it (the real sweep where `status`,
trials.parquet and the report agree: tests/integration/test_sweep_states.py)."""
import pytest

from distppo.sweep.states import STATES, trial_restarts, trial_state

N = 3  # iterations of the trial


@pytest.mark.parametrize("tune, finished, iteration, alive, state", [
    # done: a finished copy wins over anything Tune says (its rows are all there)
    ("ERROR", True, 3, False, "done"),
    (None, True, 3, True, "done"),
    # done: Tune's TERMINATED with rows reaching the last iteration, the copy not seen yet
    ("TERMINATED", False, 3, True, "done"),
    # Tune's TERMINATED short of the end: an interrupt stopped it
    ("TERMINATED", False, 1, False, "stopped"),
    ("TERMINATED", False, 1, True, "running"),
    ("ERROR", False, 1, True, "failed"),
    ("ERROR", False, 0, False, "failed"),
    ("RUNNING", False, 0, True, "running"),
    ("RUNNING", False, 2, False, "stopped"),  # the driver was killed
    ("PAUSED", False, 1, True, "running"),
    ("PENDING", False, 1, True, "running"),  # waits to restart after a crash
    (None, False, 2, False, "stopped"),  # Tune's record went with a killed driver
    ("PENDING", False, 0, True, "pending"),
    (None, False, 0, False, "pending"),
])
def test_each_rule(tune, finished, iteration, alive, state):
    assert trial_state(tune, finished, iteration, N, alive) == state
    assert state in STATES


@pytest.mark.parametrize("tune, failures, logged, restarts", [
    ("ERROR", 2, 1, 1),        # --max-failures 1: restarted once, then failed for good
    ("ERROR", 1, 0, 0),        # --max-failures 0: failed with no restart
    ("TERMINATED", 1, 1, 1),   # restarted once and finished
    ("RUNNING", 1, 0, 1),      # restarting now, its fault-log file not written yet
    ("TERMINATED", 0, 2, 2),   # a killed driver's Tune state lost its count: the fault log
    (None, 0, 0, 0),
])
def test_restarts_are_failures_followed_by_a_restart(tune, failures, logged, restarts):
    assert trial_restarts(tune, failures, logged) == restarts
