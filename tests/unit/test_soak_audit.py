"""The chaos soak's audit of resumes (launch/soak_audit.py): a resume from an older run copy
than its trial's newest, or from 0 after a copy existed, is found; one from the newest is not.
The copies are (trial id, iteration, resumed_from) as the soak notes them from each copy's
trial.json while the sweep runs."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "launch"))

from soak_audit import counted_faults, resumes_behind  # noqa: E402


def test_resumes_from_the_newest_copy_pass():
    copies = [("a", 2, [0]), ("a", 4, [0]), ("a", 6, [0, 4]), ("a", 8, [0, 4, 6]),
              ("b", 2, [0]), ("b", 4, [0, 2])]
    assert resumes_behind(copies) == (3, [])


def test_an_attempt_that_made_no_copy_is_no_resume_behind():
    # attempt 1 of "a" died before its first copy: attempt 2 starts from copy 4 again
    copies = [("a", 4, [0]), ("a", 6, [0, 4])]
    assert resumes_behind(copies) == (1, [])


def test_a_resume_from_an_older_copy_or_from_zero_is_found():
    older = [("a", 2, [0]), ("a", 4, [0]), ("a", 6, [0, 2])]  # copy 4 existed, started at 2
    assert resumes_behind(older) == (1, ["a attempt 1 from 2, newest 4"])
    # a copy pruned before the audit still counts: the soak saw it while the sweep ran
    from_zero = [("a", 4, [0]), ("a", 2, [0, 0])]
    assert resumes_behind(from_zero) == (1, ["a attempt 1 from 0, newest 4"])
    # behind an earlier attempt's copies, not only the one just before
    deep = [("a", 8, [0]), ("a", 10, [0, 8, 4])]
    assert resumes_behind(deep) == (2, ["a attempt 2 from 4, newest 8"])
    # an attempt that re-made an iteration an earlier one made: both copies are seen
    remade = [("a", 6, [0]), ("a", 6, [0, 4]), ("a", 8, [0, 4])]
    assert resumes_behind(remade) == (1, ["a attempt 1 from 4, newest 6"])


def test_a_learner_give_up_is_booked_as_the_learner_kill():
    rows = [{"trial_id": "a", "runner_restarts": 1, "learner_recoveries": 2},
            {"trial_id": "a", "runner_restarts": 2, "learner_recoveries": 3}]
    trials = [{"trial_id": "a", "restarts": 2}]
    errors = ["ray.exceptions.RayTaskError: LearnerFailure: learners died 4 times; giving up\n"]
    assert counted_faults(rows, trials, errors) == (2, 4, 1, 1)
