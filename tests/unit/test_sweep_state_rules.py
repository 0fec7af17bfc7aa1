"""sweep/states.py's rules, each on the facts that decide it (the real sweep where `status`,
trials.parquet and the report agree: tests/integration/test_sweep_states.py)."""
import pytest

from distppo.sweep.states import (
    PREEMPTION,
    RESTART,
    STATES,
    last_restart_preempted,
    restart_kind,
    saved_tune_status,
    trial_restarts,
    trial_state,
)

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


@pytest.mark.parametrize("tune, finished, iteration, alive, state", [
    ("PENDING", False, 2, True, "preempted"),   # waits for a node after its node was preempted
    ("PENDING", False, 0, True, "preempted"),   # preempted before its first copy
    ("PENDING", False, 2, False, "stopped"),    # no driver will start it: --resume
    ("RUNNING", False, 2, True, "running"),     # started again since
    ("ERROR", False, 2, True, "failed"),        # a later failure ended it
    ("TERMINATED", False, 3, True, "done"),
])
def test_preempted_is_a_trial_waiting_to_continue_after_a_preemption(tune, finished, iteration,
                                                                      alive, state):
    assert trial_state(tune, finished, iteration, N, alive, preempted=True) == state
    assert state in STATES


@pytest.mark.parametrize("at_start, now, kind", [
    (0, 0, PREEMPTION),   # Tune did not count it (RayActorError.preempted)
    (1, 1, PREEMPTION),
    (0, 1, RESTART),      # a failure Tune counted against max_failures
    (None, 0, RESTART),   # the attempt's start was not seen: never claim a preemption
])
def test_a_restart_tune_did_not_count_is_a_preemption(at_start, now, kind):
    assert restart_kind(at_start, now) == kind


def test_the_newest_logged_restart_decides():
    assert last_restart_preempted({PREEMPTION: 5})
    assert last_restart_preempted({RESTART: 4, PREEMPTION: 5})
    assert not last_restart_preempted({RESTART: 6, PREEMPTION: 5})
    assert not last_restart_preempted({})


@pytest.mark.parametrize("saved, recorded, status", [
    ("RUNNING", "failed", "ERROR"),   # the actor died before Tune stopped it: not re-saved
    (None, "failed", "ERROR"),        # Tune's state went with a killed driver
    ("ERROR", "failed", "ERROR"),
    ("RUNNING", "running", "RUNNING"),
    ("ERROR", None, "ERROR"),         # no trials.parquet yet
    ("PENDING", "preempted", "PENDING"),
])
def test_the_drivers_record_of_a_failure_counts_as_tunes(saved, recorded, status):
    assert saved_tune_status(saved, recorded) == status
