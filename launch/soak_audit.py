"""What the chaos soak (launch/chaos_soak.py) reads back from a finished sweep: its rows, the
faults the product counted, and whether each resume started from its trial's newest copy.
Plain functions of what was read; the soak compares them with what it did."""
from __future__ import annotations

import re

# The error Tune records when a trial process gave up on its learners (core/loop.py)
GIVE_UP = re.compile(r"LearnerFailure: learners died \d+ times; giving up$", re.M)


def row_checks(iterations: list, trials: list, n_iter: int, per_iter: int) -> dict:
    """Rows duplicated, lost (a trial's 1..n_iter not there), with a global_step other than
    iteration x per_iter, and trials not done."""
    keys = [(r["trial_id"], r["iteration"]) for r in iterations]
    expected = {(t["trial_id"], i) for t in trials for i in range(1, n_iter + 1)}
    return {"duplicates": len(keys) - len(set(keys)), "missing": len(expected - set(keys)),
            "wrong_step": sum(r["global_step"] != r["iteration"] * per_iter for r in iterations),
            "not_done": sum(t["status"] != "done" for t in trials)}


def counted_faults(iterations: list, trials: list, errors: list) -> tuple[int, int, int, int]:
    """(runner restarts, learner recoveries, trial restarts, learner give-ups) the sweep counted.

    A learner death past MAX_LEARNER_RECOVERIES in one trial process fails the trial, and Tune
    restarts it: that kill is counted once, as a trial restart whose error (errors: each
    trial's error.txt) is the learners' give-up, so it is booked as the learner kill it is."""
    last: dict = {}  # per trial, the highest value of each cumulative counter
    for r in iterations:
        for column in ("runner_restarts", "learner_recoveries"):
            key = (r["trial_id"], column)
            last[key] = max(last.get(key, 0), r[column])
    runner = sum(v for (_, c), v in last.items() if c == "runner_restarts")
    learner = sum(v for (_, c), v in last.items() if c == "learner_recoveries")
    trial = sum(t["restarts"] for t in trials)
    give_ups = sum(len(GIVE_UP.findall(text)) for text in errors)
    return runner, learner + give_ups, trial - give_ups, give_ups


def resumes_behind(copies: list) -> tuple[int, list[str]]:
    """(resumes, those that started behind): every resume a run copy shows, and those that
    started from an older copy than the newest one an earlier attempt of the trial had made.

    copies: (trial id, iteration, resumed_from) of every copy seen; resumed_from lists the
    copy iteration each attempt started from (0: none), so a copy of attempt k has k + 1
    entries. A resume from the newest copy re-runs fewer iterations than the checkpoint
    interval (the attempt before made no copy after it); one that started behind it, or
    from 0 after a copy existed, re-runs more: that is what this counts."""
    newest: dict = {}  # trial -> {attempt: the highest copy iteration it made}
    final: dict = {}  # trial -> the longest resumed_from seen
    for trial, iteration, started in copies:
        attempt = len(started) - 1
        made = newest.setdefault(trial, {})
        made[attempt] = max(made.get(attempt, 0), iteration)
        if len(started) > len(final.get(trial, [])):
            final[trial] = started
    resumes, behind = 0, []
    for trial, started in final.items():
        for k in range(1, len(started)):
            resumes += 1
            made = max([started[k - 1], *(it for a, it in newest[trial].items() if a < k)])
            if started[k] < made:
                behind.append(f"{trial} attempt {k} from {started[k]}, newest {made}")
    return resumes, behind


def markdown(rows: list) -> str:
    return "| check | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
