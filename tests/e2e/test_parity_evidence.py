"""What a parity study's folder keeps and what its README may claim (launch/parity_files.py,
parity_stats.py, parity_report.py): the committed studies rebuild from their Parquet copy of
the event files to exactly the committed files, the statistics against hand-computed cases,
and the rule fixed in study.json at a study's start and refused once changed.
"""
import glob
import json
import math
import os
import shutil
import sys

import numpy as np
import pandas as pd
import pytest

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "launch"))
import parity_report as pr  # noqa: E402
import parity_stats as stats  # noqa: E402
import parity_study  # noqa: E402

RESULTS = os.path.join(REPO, "docs", "results")
REBUILT = ("README.md", "returns.parquet", "diagnostics.parquet", "scalars.parquet",
           "sessions.json")
# what each committed README must say, from its folder's files
SAYS = {
    "parity-breakout": [
        "**Verdict: difference found** (all runs finished)",
        "Flagged by the judged test: clipfrac, entropy, value_loss (clipfrac p 0.0023, "
        "entropy p 0.0022, value_loss p 0.0080)",
        "| distppo | 2 | 999,424 | 2048 | 999,424 | 4: resumed from iteration 400, 400, 400 |",
        "| distppo | 3 | 999,424 | 2019 | 999,424 | 2: resumed from iteration 600 |",
        "fails for two identical sides in 21.3% of studies and passes for sides whose means "
        "are one seed std apart in 55.1%",
        "EnvPool 1.2.5", "108,000", "was fixed 21.1 h before it"],
    "parity-breakout-early": [
        "**Verdict: no difference found** on the diagnostics of iterations 1-100, by seed",
        "| clipfrac | 0.06695 | 0.06235 | 9, 9 | 0.2382 | no | -18.9% to +5.0% |",
        "| value_loss | 0.01842 | 0.01772 | 9, 9 | 0.7461 | no | -29.4% to +21.3% |",
        "the rule was fixed **4.5 min after it started**",
        "Committed while cleanrl seed 1, distppo seed 1 ran",
        "Committed while cleanrl seed 1, cleanrl seed 2 ran",
        "| cleanrl | 4 | 102,400 | 477 | 102,400 | 1 |"],
}


@pytest.mark.parametrize("name", sorted(SAYS))
@pytest.mark.timeout(900)  # the permutation tests and intervals on a loaded 2-core machine
def test_committed_study_rebuilds_from_its_folder(tmp_path, monkeypatch, name):
    """No event file is committed; --report-only rebuilds every number, the README and the
    copy itself byte for byte from scalars.parquet, sessions.json and the run folders."""
    src = os.path.join(RESULTS, name)
    out = tmp_path / name
    shutil.copytree(src, out)
    assert not glob.glob(str(out / "**" / "events.out.tfevents.*"), recursive=True)
    monkeypatch.setattr(sys, "argv", ["parity_study.py", "--out", str(out), "--report-only"])
    parity_study.main()
    for f in REBUILT:
        assert (out / f).read_bytes() == open(os.path.join(src, f), "rb").read(), f
    readme = (out / "README.md").read_text()
    for line in SAYS[name]:
        assert line in readme, line
    assert "equivalent**" not in readme.split("## Verdict rule")[0]


def test_binned_curves_end_at_the_stop():
    returns = pd.DataFrame({"side": "cleanrl", "seed": 1, "global_step": [10, 102_400, 102_300],
                            "episodic_return": [1.0, 2.0, 4.0]})
    assert pr.bin_steps(100) == 10 * pr.BATCH and pr.bin_steps(None) == pr.BIN_STEPS
    c = pr.binned_curves(returns, 50_000, horizon=102_400)
    assert c["bin_end"].tolist() == [50_000, 102_400]  # not 150,000
    assert c["mean"].tolist() == [1.0, 3.0]


def test_shift_interval_is_where_the_test_stops_rejecting():
    a = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    b = a + 10 + np.array([0.3, -0.2, 0.1, 0.0, -0.1])
    low, high = stats.shift_interval(a, b)
    assert low < b.mean() - a.mean() < high
    for end, outward in ((low, -1), (high, 1)):
        assert stats.permutation_p(a, b - (end - outward * 1e-6)) > 0.05
        assert stats.permutation_p(a, b - (end + outward * 1e-3)) <= 0.05
    # 3 against 3: the smallest p is 2/20, so no shift is ever rejected at 5%
    assert stats.shift_interval(a[:3], b[:3]) == (-math.inf, math.inf)


def test_tost_against_the_margin():
    a = np.array([1.00, 1.01, 0.99, 1.02, 0.98, 1.00])
    b = a + np.array([0.004, -0.003, 0.002, 0.001, -0.002, 0.003])
    assert stats.tost_p(a, b, 0.1) < 0.05       # well within +-0.1
    assert stats.tost_p(a, b, 0.001) > 0.05     # the margin is below the spread
    assert stats.tost_p(a, a + 0.5, 0.1) > 0.5  # sides apart by more than the margin
    # the one-sided p of sides fully apart: 1 split of C(12, 6) = 924, exactly
    assert stats.one_sided_p(a + 10, a, greater=True) == 1 / 924


def test_end_rule_rates_are_the_rule_itself():
    """The simulated rates come from end_check's own rule on the same draws."""
    trials = 400
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, (trials, 3))
    b = rng.normal(1.0, 1.0, (trials, 3))
    holds = [pr.end_check({"cleanrl": a[i], "distppo": b[i]})["holds"] for i in range(trials)]
    assert np.mean(holds) == stats.end_rule_rates(3, 1.0, trials=trials, seed=0)
    # the rates the docs state, 200,000 studies a rate
    assert 1 - stats.end_rule_rates(3, 0.0) == pytest.approx(0.213, abs=0.003)
    assert stats.end_rule_rates(3, 1.0) == pytest.approx(0.551, abs=0.003)


def start(out, *more):
    argv = ["--out", str(out), "--sides", "distppo", "--seeds", "1", *more]
    return parity_study.settings_of(parity_study.parse(argv), str(out))


def test_rule_is_fixed_at_the_start_and_refused_once_changed(tmp_path, monkeypatch):
    out = tmp_path / "s"
    s = start(out, "--equivalence-margin", "0.1")
    rule = s["rule"]
    assert rule["margin"] == 0.1 and rule["sha256"] == pr.rule_digest(0.1)
    assert rule["fixed_at"].endswith("Z") and rule["amended"] == []
    assert json.loads((out / "study.json").read_text())["rule"] == rule
    assert "distppo_commit" in s and s["cleanrl_commit"] is None  # no CleanRL side asked
    # a later start keeps the rule as fixed, and another margin is refused
    assert start(out, "--equivalence-margin", "0.1", "--seeds", "2")["rule"] == rule
    with pytest.raises(SystemExit) as exc:
        start(out, "--equivalence-margin", "0.2")
    assert "equivalence_margin = 0.1, not 0.2" in str(exc.value.code)
    # the rule's text or its computation changed after the start: refused, report included
    monkeypatch.setattr(pr, "RULE", pr.RULE + "\n- one more clause")
    for more in ([], ["--report-only"]):
        with pytest.raises(SystemExit) as exc:
            start(out, "--equivalence-margin", "0.1", *more)
        text = str(exc.value.code)
        assert text.startswith(f"error: {out} fixed its verdict rule at {rule['fixed_at']}")
        assert "\n" not in text


def test_equivalence_margin_is_a_fraction(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["parity_study.py", "--out", str(tmp_path / "s"),
                                      "--equivalence-margin", "10"])
    with pytest.raises(SystemExit) as exc:
        parity_study.main()
    assert str(exc.value.code).startswith("error: --equivalence-margin is a fraction")


def test_seed_intervals_and_the_equivalence_verdict():
    """Six seeds a side, distppo's entropy 0.2% above CleanRL's: within a 10% margin every
    quantity's equivalence test holds; a quantity spread far wider than its margin fails."""
    rng = np.random.default_rng(5)
    rows = []
    for side in pr.SIDES:
        for seed in range(1, 7):
            level = {q: 1.0 + 0.005 * rng.normal() for q in pr.QUANTITIES}
            if side == "distppo":
                level["entropy"] *= 1.002
            rows += [{"side": side, "seed": seed, "iteration": it, "global_step": it * 1024,
                      **level} for it in range(1, 11)]
    diag = pd.DataFrame(rows)
    e = pr.seed_intervals(diag, 10, margin=0.1).set_index("quantity")
    assert e["equivalent"].all() and (e["tost_p"] < 0.05).all()
    assert e.loc["entropy", "low"] < 0.002 < e.loc["entropy", "high"]
    tests = pr.diagnostics_tests(diag, 10, by_seed=True)
    assert pr.verdict(None, tests, e.reset_index()) == "equivalent"
    tight = pr.seed_intervals(diag, 10, margin=0.001).set_index("quantity")
    assert not tight["equivalent"].all()
    assert pr.verdict(None, tests, tight.reset_index()) == "no difference found"
