"""The parity study (launch/parity_study.py, launch/parity_report.py): its numbers against
hand-computed ones, and one real study end to end on a tiny budget, interrupted and continued.

The end-to-end study runs CleanRL's own script when DISTPPO_CLEANRL_DIR names a CleanRL
checkout and gym + tyro (CleanRL's imports, not distppo's) are installed; otherwise distppo's
side alone, and the CleanRL checks are skipped with the reason. Nothing is installed here.
"""
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from helpers import REPO, wait_for

sys.path.insert(0, os.path.join(REPO, "launch"))
import parity_report as pr  # noqa: E402
import parity_study  # noqa: E402

CLEANRL_DIR = os.environ.get("DISTPPO_CLEANRL_DIR", "")
NO_CLEANRL = (
    "DISTPPO_CLEANRL_DIR is not set to a CleanRL checkout" if not os.path.isfile(
        os.path.join(CLEANRL_DIR, parity_study.SCRIPT)) else
    "CleanRL's script needs gym and tyro (pip install gym==0.26.2 tyro)" if any(
        importlib.util.find_spec(m) is None for m in ("gym", "tyro")) else None)


def games(side, seed, steps, values):
    return pd.DataFrame({"side": side, "seed": seed, "global_step": steps,
                         "episodic_return": [float(v) for v in values]})


# --- the pure numbers, by hand -------------------------------------------------------------------

def test_binned_curves_by_hand():
    returns = pd.concat([games("cleanrl", 1, [10_000, 50_000, 50_001], [1, 3, 10]),
                         games("cleanrl", 2, [20_000], [5]),
                         games("distppo", 1, [100_000], [4])], ignore_index=True)
    c = pr.binned_curves(returns, 50_000).set_index(["side", "bin_end"])
    # cleanrl, bin (0, 50k]: seed 1 mean(1, 3) = 2, seed 2: 5
    assert c.loc[("cleanrl", 50_000)].tolist() == [3.5, 2.0, 5.0, 2]
    # 50,001 is the next bin's; seed 2 has no game there and is left out
    assert c.loc[("cleanrl", 100_000)].tolist() == [10.0, 10.0, 10.0, 1]
    assert c.loc[("distppo", 100_000)].tolist() == [4.0, 4.0, 4.0, 1]
    assert len(c) == 3


def test_runs_status_counts_the_runs_asked_for():
    def info(*runs):
        return pd.DataFrame([{"side": side, "seed": seed, "finished": done}
                             for side, seed, done in runs])
    both = {"seeds": [1, 2, 3], "sides": ["cleanrl", "distppo"]}
    assert pr.runs_status(both, info(("distppo", 1, True), ("cleanrl", 1, False))) == (
        "**partial**: 1 of 6 runs finished, 1 not finished (marked (partial)), 4 not started; "
        "rerun the study's command to continue")
    assert pr.runs_status({"seeds": [1]}, info(("distppo", 1, True))).startswith(
        "**partial**: 1 of 2")  # a folder without `sides` was asked for both
    assert pr.runs_status({"seeds": [1], "sides": ["distppo"]},
                          info(("distppo", 1, True))) == "all runs finished"
    assert pr.runs_status(both, info(*[(side, seed, True) for seed in (1, 2, 3)
                                       for side in both["sides"]])) == "all runs finished"


def test_last100_at_fractions_by_hand():
    # game i (1..150) ends at step 100 i with return i
    returns = pd.concat([games("cleanrl", 1, [100 * i for i in range(1, 151)], range(1, 151)),
                         games("distppo", 1, [100 * i for i in range(1, 151)], range(1, 151))],
                        ignore_index=True)
    runs = pd.DataFrame({"side": ["cleanrl", "distppo", "distppo"], "seed": [1, 1, 2],
                         "finished": [True, False, False], "last_step": [20_000, 12_000, 9_000]})
    t = pr.last100_at(returns, runs, total=20_000).set_index(["side", "seed", "fraction"])
    v = t["value"]
    assert v[("cleanrl", 1, 0.25)] == 25.5     # games 1..50
    assert v[("cleanrl", 1, 0.5)] == 50.5      # games 1..100
    assert v[("cleanrl", 1, 0.75)] == 100.5    # the last 100 of 1..150: 51..150
    assert v[("cleanrl", 1, 1.0)] == 100.5
    assert v[("distppo", 1, 0.5)] == 50.5
    # a partial run has no value at a point it has not reached
    assert math.isnan(v[("distppo", 1, 0.75)]) and math.isnan(v[("distppo", 1, 1.0)])
    # a run without games has none anywhere
    assert all(math.isnan(x) for x in v.loc["distppo", 2])
    assert t.loc[("cleanrl", 1, 0.25), "games"] == 50


def test_end_check_margin_by_hand():
    # cleanrl mean 12, std 2 (ddof 1: var (4 + 0 + 4) / 2)
    holds = pr.end_check({"cleanrl": [10, 12, 14], "distppo": [11, 13, 15]})
    assert (holds["mean_cleanrl"], holds["std_cleanrl"], holds["diff"], holds["margin"]) == \
        (12.0, 2.0, 1.0, 2.0) and holds["holds"] is True
    # a difference equal to the margin is not "less than" it
    assert pr.end_check({"cleanrl": [10, 12, 14], "distppo": [12, 14, 16]})["holds"] is False
    # the larger side's std is the margin: distppo std 8, diff 6
    wide = pr.end_check({"cleanrl": [10, 12, 14], "distppo": [10, 18, 26]})
    assert (wide["margin"], wide["diff"], wide["holds"]) == (8.0, 6.0, True)
    few = pr.end_check({"cleanrl": [10, 12, 14], "distppo": [12.0, math.nan]})
    assert few["holds"] is None and few["n_distppo"] == 1


def test_permutation_p_by_hand():
    # 3 vs 3: 20 splits, two of which (the observed and its mirror) are as extreme: p = 0.1
    p = pr.permutation_p(np.zeros(3), np.ones(3))
    assert abs(p - 0.1) < 0.015
    assert p == pr.permutation_p(np.zeros(3), np.ones(3))  # a fixed seed
    assert pr.permutation_p(np.arange(5.0), np.arange(5.0)) == 1.0
    # far apart: no relabelling reaches the observed difference, p = 1 / (10,000 + 1)
    assert pr.permutation_p(np.zeros(50), np.ones(50) + np.arange(50) * 1e-3) == 1 / 10_001


def diag_frame(shift_entropy, seeds=(1, 2, 3)):
    rng = np.random.default_rng(3)
    rows = []
    for side in pr.SIDES:
        for seed in seeds:
            for it in range(1, 151):
                row = {q: rng.normal() for q in pr.QUANTITIES}
                if it > 100:  # after the window: no matter how far apart
                    row = {q: v + (1000 if side == "distppo" else 0) for q, v in row.items()}
                elif side == "distppo":
                    row["entropy"] += shift_entropy
                rows.append({"side": side, "seed": seed, "iteration": it,
                             "global_step": it * 1024, **row})
    frame = pd.DataFrame(rows)
    frame.loc[0, "explained_variance"] = math.nan  # CleanRL's NaN of constant returns
    return frame


def test_diagnostics_tests_use_the_first_100_iterations():
    # fewer permutations than a study's, to keep the test short: p is still as low as 1/2001
    same = pr.diagnostics_tests(diag_frame(0.0), permutations=2000).set_index("quantity")
    assert not same["differs"].any()
    assert same.loc["approx_kl", "n_cleanrl"] == 300 and same.loc["approx_kl", "n_distppo"] == 300
    assert same.loc["explained_variance", "n_cleanrl"] == 299  # the NaN is left out
    shifted = pr.diagnostics_tests(diag_frame(1.0), permutations=2000).set_index("quantity")
    assert shifted.loc["entropy", "differs"] and shifted.loc["entropy", "p"] < 0.05 / 6
    assert not shifted.drop("entropy")["differs"].any()


def test_diagnostics_tests_by_seed_count_each_run_once():
    kw = {"by_seed": True, "permutations": 2000}
    three = pr.diagnostics_tests(diag_frame(1.0), **kw).set_index("quantity")
    assert (three["n_cleanrl"] == 3).all() and (three["n_distppo"] == 3).all()
    # the side's mean of its seeds' means over iterations 1-100, by hand
    d = diag_frame(1.0)
    first = d[(d["iteration"] <= 100) & (d["side"] == "distppo")]
    by_hand = np.mean([first[first["seed"] == k]["entropy"].mean() for k in (1, 2, 3)])
    assert three.loc["entropy", "mean_distppo"] == pytest.approx(by_hand)
    # 300 shifted iterations differ (test above); 3 seeds a side cannot: no split of 20
    # reaches p < 0.05 / 6, so every quantity is undecided, not "no difference"
    assert three["p"].isna().all() and three["differs"].isna().all()
    assert pr.verdict(None, three.reset_index()) == "undecided"
    six = pr.diagnostics_tests(diag_frame(1.0, seeds=range(1, 7)), **kw).set_index("quantity")
    # every distppo seed above every CleanRL one: the split and its mirror of 924, exactly
    assert six.loc["entropy", "differs"] and six.loc["entropy", "p"] == 2 / 924
    assert not six.drop("entropy")["differs"].any()
    # a run short of the iterations (not finished, or failed) gives no seed value
    short = diag_frame(1.0, seeds=range(1, 7))
    short = short[~((short["side"] == "distppo") & (short["seed"] == 6)
                    & (short["iteration"] > 50))]
    cut = pr.diagnostics_tests(short, **kw).set_index("quantity")
    assert (cut["n_distppo"] == 5).all() and (cut["n_cleanrl"] == 6).all()


def test_can_differ_and_the_exact_permutation_p():
    # the smallest p: 2 / C(2n, n) with equal sides, 1 / C(a + b, a) otherwise; vs 0.05 / 6
    assert not pr.can_differ(3, 3) and not pr.can_differ(4, 4) and not pr.can_differ(2, 9)
    assert pr.can_differ(5, 5) and pr.can_differ(4, 5) and pr.can_differ(9, 9)
    # exact below 10,000 splits: 5 against 5 fully apart is the split and its mirror of 252
    assert pr.permutation_p(np.zeros(5), np.ones(5)) == 2 / 252
    # {0, 1, 2} vs {1, 2, 3}: |mean difference| 1, i.e. a side of 3 summing to <= 3 or >= 6;
    # of the 20 triples of 0, 1, 2, 1, 2, 3, counted by hand, 5 sum to <= 3 and 5 to >= 6
    assert pr.permutation_p(np.array([0.0, 1, 2]), np.array([1.0, 2, 3])) == 10 / 20


def test_cut_at_stop_keeps_the_steps_every_run_holds():
    returns = games("distppo", 1, [1024, 2048, 2049, 5000], [1, 2, 3, 4])
    diag = diag_frame(0.0)
    r, d = pr.cut_at_stop(returns, diag, 2)
    assert r["global_step"].tolist() == [1024, 2048] and r.index.tolist() == [0, 1]
    assert sorted(set(d["iteration"])) == [1, 2] and len(d) == 2 * 3 * 2


@pytest.mark.parametrize("stop", [None, 100])
def test_report_of_a_study_with_no_run_yet(tmp_path, stop):
    """--report-only before any run has a folder (stopped at once): undecided, every file."""
    settings = json.loads(open(os.path.join(REPO, "docs", "results", "parity-breakout",
                                            "study.json")).read())
    settings["stop_at_iteration"] = stop
    assert pr.write_report(str(tmp_path), settings, []) == "undecided"
    assert "**Verdict: undecided**" in (tmp_path / "README.md").read_text()
    assert len(pd.read_parquet(tmp_path / "returns.parquet")) == 0
    assert len(pd.read_parquet(tmp_path / "diagnostics.parquet")) == 0


def test_a_study_from_before_the_stop_flag_continues(tmp_path):
    """study.json of a study started before --stop-at-iteration existed (the committed
    Breakout study's) continues without the flag, and is refused with it."""
    out = tmp_path / "s"
    out.mkdir()
    old = os.path.join(REPO, "docs", "results", "parity-breakout", "study.json")
    (out / "study.json").write_text(open(old).read())
    argv = ["--out", str(out), "--sides", "distppo", "--env-id", "Breakout-v5",
            "--total-timesteps", "1000000"]
    s = parity_study.settings_of(parity_study.parse(argv), str(out))
    assert s["stop_at_iteration"] is None and s["seeds"] == [1, 2, 3]
    with pytest.raises(SystemExit) as exc:
        parity_study.settings_of(parity_study.parse(argv + ["--stop-at-iteration", "100"]),
                                 str(out))
    assert str(exc.value.code) == (f"error: {out} holds a study with stop_at_iteration = not "
                                   "given, not 100: give the same value to continue it, or "
                                   "another --out")


def test_verdict_rule():
    tests = pd.DataFrame({"differs": [False] * 6})
    # the rule's tests not separating the sides is "no difference found", never "equivalent"
    assert pr.verdict({"holds": True}, tests) == "no difference found"
    assert pr.verdict({"holds": False}, tests) == "difference found"
    assert pr.verdict({"holds": None}, tests) == "undecided"
    one = pd.DataFrame({"differs": [False] * 5 + [True]})
    assert pr.verdict({"holds": True}, one) == "difference found"
    assert pr.verdict({"holds": None}, one) == "difference found"
    missing = pd.DataFrame({"differs": [False] * 5 + [None]})
    assert pr.verdict({"holds": True}, missing) == "undecided"
    # a study stopped early: its diagnostics alone
    assert pr.verdict(None, tests) == "no difference found"
    assert pr.verdict(None, one) == "difference found"
    assert pr.verdict(None, missing) == "undecided"
    # "equivalent" only with every equivalence test against the stated margin holding
    held = pd.DataFrame({"equivalent": [True] * 6})
    assert pr.verdict(None, tests, held) == "equivalent"
    assert pr.verdict({"holds": True}, tests, held) == "equivalent"
    assert pr.verdict(None, one, held) == "difference found"
    short = pd.DataFrame({"equivalent": [True] * 5 + [False]})
    assert pr.verdict(None, tests, short) == "no difference found"
    assert pr.verdict(None, tests, pd.DataFrame({"equivalent": [True] * 5 + [None]})) == \
        "no difference found"


@pytest.mark.parametrize("argv, message", [
    (["--env-id", "BreakoutNoFrameskip-v4"], "EnvPool ids"),
    (["--total-timesteps", "100"], "at least one iteration"),
    (["--seeds", "1", "1"], "distinct"),
    (["--stop-at-iteration", "0"], "must be 1 to 975, fewer than the budget's 976"),
    (["--stop-at-iteration", "976"], "must be 1 to 975, fewer than the budget's 976"),
    (["--total-timesteps", "4096", "--stop-at-iteration", "5"], "budget's 4 iterations"),
    (["--sides", "cleanrl", "--cleanrl-dir", "/no/such/dir"], "no cleanrl/ppo_atari_envpool.py"),
    (["--report-only"], "study.json not found"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, argv, message):
    monkeypatch.setattr(sys, "argv", ["parity_study.py", "--out", str(tmp_path / "s"), *argv])
    with pytest.raises(SystemExit) as exc:
        parity_study.main()
    text = str(exc.value.code)
    assert text.startswith("error: ") and message in text and "\n" not in text


# --- one real study, end to end ----------------------------------------------------------------

STEPS = 3 * pr.BATCH  # three iterations a run


def study_cmd(out, *more):
    sides = list(pr.SIDES) if NO_CLEANRL is None else ["distppo"]
    return [sys.executable, os.path.join(REPO, "launch", "parity_study.py"), "--out", str(out),
            "--seeds", "1", "--total-timesteps", str(STEPS), "--sides", *sides,
            # a checkpoint (and metrics.parquet) after iteration 1, so the SIGTERM below lands
            # with two iterations still to run, however fast the machine
            "--distppo-flags", "--local --checkpoint-every 1",
            *(["--cleanrl-dir", CLEANRL_DIR] if NO_CLEANRL is None else []), *more]


def appeared(path, proc):
    """A predicate for wait_for: `path` exists; the study ending first fails with its output."""
    def check() -> bool:
        if os.path.exists(path):
            return True
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        return False
    return check


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study stopped by SIGTERM after distppo's first iteration, then the same command
    twice: it continues the runs, then keeps them."""
    out = tmp_path_factory.mktemp("parity") / "study"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = subprocess.Popen(study_cmd(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env, cwd=REPO)
    metrics = out / "runs" / "distppo-seed1" / "metrics.parquet"
    wait_for(appeared(metrics, first), 600, f"{metrics} did not appear")
    first.send_signal(signal.SIGTERM)
    stopped = first.communicate(timeout=180)[0]
    again = subprocess.run(study_cmd(out), capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=900)
    kept = subprocess.run(study_cmd(out), capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    return {"out": out, "first": (first.returncode, stopped), "again": again, "kept": kept}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the study's runs, on a loaded 2-core machine
def test_study_stops_continues_and_keeps(study):
    out = study["out"]
    rc, text = study["first"]
    assert rc == 130 and "interrupted" in text, text[-3000:]
    assert study["again"].returncode == 0, study["again"].stdout[-3000:] + study["again"].stderr
    assert "distppo seed 1: resumed" in study["again"].stdout
    distppo_log = (out / "logs" / "distppo-seed1.log").read_text()
    assert "stopped by SIGTERM" in distppo_log and "--resume" in distppo_log
    # a finished run is kept: the third start runs nothing
    kept = study["kept"]
    assert kept.returncode == 0 and "distppo seed 1: finished before, kept" in kept.stdout
    assert distppo_log == (out / "logs" / "distppo-seed1.log").read_text()
    readme = (out / "README.md").read_text()
    assert "**Verdict: undecided**" in readme and "all runs finished" in readme
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the study's runs, on a loaded 2-core machine
def test_study_rebuilds_without_its_event_files(study, tmp_path):
    """The report's copy of the event files (scalars.parquet, sessions.json) stands in for
    them: with every event file gone the study rebuilds the same numbers and README."""
    out = tmp_path / "copy"
    shutil.copytree(study["out"], out)
    kept = {f: (out / f).read_bytes() for f in ("README.md", "returns.parquet",
                                                 "diagnostics.parquet", "scalars.parquet")}
    events = glob.glob(str(out / "runs" / "**" / "events.out.tfevents.*"), recursive=True)
    assert events and all(".gitignore" not in e for e in events)
    assert "runs/**/events.out.tfevents.*" in (out / ".gitignore").read_text()
    for path in events:
        os.remove(path)
    rebuilt = subprocess.run([sys.executable, os.path.join(REPO, "launch", "parity_study.py"),
                              "--out", str(out), "--report-only"], capture_output=True,
                             text=True, cwd=REPO, timeout=300)
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr
    assert {f: (out / f).read_bytes() for f in kept} == kept
    # the stopped distppo run: two processes, the second continuing after the checkpoint the
    # first one reached (its first point is the iteration after it)
    processes = json.loads((out / "sessions.json").read_text())["distppo-seed1"]["sessions"]
    assert len(processes) == 2 and processes[1]["first_step"] % pr.BATCH == 0
    resumed_from = processes[1]["first_step"] // pr.BATCH - 1
    assert 0 <= resumed_from < 3
    assert re.search(r"\| distppo \| 1 \| 3,072 \| \d+ \| 3,072 \| 2: resumed from iteration "
                     rf"{resumed_from} \| [0-9a-f]{{10}}", kept["README.md"].decode())
    study_json = json.loads((out / "study.json").read_text())
    assert study_json["rule"]["sha256"] == pr.rule_digest(None)
    assert study_json["distppo_commit"] and json.loads(
        (out / "logs" / "distppo-seed1.done.json").read_text())["commit"] == \
        study_json["distppo_commit"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the study's runs, on a loaded 2-core machine
def test_study_distppo_side_read_back(study):
    from distppo.telemetry.parquet import read_metrics
    out = study["out"]
    returns = pd.read_parquet(out / "returns.parquet")
    diag = pd.read_parquet(out / "diagnostics.parquet")
    assert list(returns.columns) == list(pr.RETURN_COLUMNS)
    assert list(diag.columns) == list(pr.DIAGNOSTIC_COLUMNS)
    metrics = read_metrics(out / "runs" / "distppo-seed1" / "metrics.parquet").to_pandas()
    ours = returns[returns["side"] == "distppo"]
    # one row per game: as many as the iterations counted, each at its iteration's step
    assert len(ours) == metrics["episodes"].sum() > 0
    for row in metrics[metrics["episodes"] > 0].itertuples():
        at = ours[ours["global_step"] == row.global_step]["episodic_return"]
        assert len(at) == row.episodes and at.mean() == pytest.approx(row.episodic_return_mean)
    d = diag[diag["side"] == "distppo"]
    assert d["iteration"].tolist() == [1, 2, 3] and set(d["seed"]) == {1}
    for q in pr.QUANTITIES:
        np.testing.assert_allclose(d[q].to_numpy(), metrics[q].to_numpy(dtype=float))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the study's runs, on a loaded 2-core machine
def test_study_cleanrl_side_read_back(study):
    if NO_CLEANRL:
        pytest.skip(f"CleanRL's side not run: {NO_CLEANRL}")
    out = study["out"]
    returns = pd.read_parquet(out / "returns.parquet")
    diag = pd.read_parquet(out / "diagnostics.parquet")
    log = (out / "logs" / "cleanrl-seed1.log").read_text()
    # restarted from scratch after the stop: the log holds two starts, the last one complete
    assert log.count("\n$ ") == 2
    last = log.rsplit("\n$ ", 1)[1]
    printed = [(int(s), float(r)) for s, r in
               re.findall(r"global_step=(\d+), episodic_return=([-\d.]+)", last)]
    theirs = returns[returns["side"] == "cleanrl"]
    assert list(zip(theirs["global_step"], theirs["episodic_return"])) == printed
    assert len(printed) > 0
    c = diag[diag["side"] == "cleanrl"]
    assert c["iteration"].tolist() == [1, 2, 3]
    assert c["global_step"].tolist() == [1024, 2048, 3072]
    assert ((c["entropy"] > 0) & (c["entropy"] <= math.log(4) + 1e-6)).all()  # 4 actions
    assert ((c["clipfrac"] >= 0) & (c["clipfrac"] <= 1)).all() and (c["approx_kl"] >= 0).all()
    assert (c["value_loss"] > 0).all()


@pytest.mark.slow
@pytest.mark.timeout(900)  # one run of a few iterations, on a loaded 2-core machine
def test_study_stopped_early_is_judged_by_seed(tmp_path):
    out = tmp_path / "early"
    cmd = [sys.executable, os.path.join(REPO, "launch", "parity_study.py"), "--out", str(out),
           "--seeds", "1", "--sides", "distppo", "--total-timesteps", "1000000",
           "--distppo-flags", "--local --checkpoint-every 1", "--stop-at-iteration"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    run = subprocess.run(cmd + ["2"], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=480)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert "distppo seed 1: finished in" in run.stdout
    assert "stopped by SIGTERM" in (out / "logs" / "distppo-seed1.log").read_text()
    from distppo.telemetry.parquet import read_metrics
    ran = read_metrics(out / "runs" / "distppo-seed1" / "metrics.parquet").num_rows
    assert 2 <= ran < 976  # stopped, not run out
    # the study's files end at the stop, whatever a run did before the SIGTERM reached it
    assert pd.read_parquet(out / "diagnostics.parquet")["iteration"].tolist() == [1, 2]
    assert (pd.read_parquet(out / "returns.parquet")["global_step"] <= 2 * pr.BATCH).all()
    readme = (out / "README.md").read_text()
    assert "| 100% (2,048) |" in readme
    assert ("**Verdict: undecided** on the diagnostics of iterations 1-2, by seed (all runs "
            "finished)") in readme
    assert "Diagnostics of iterations 1-2, by seed (judged)" in readme
    assert "not judged: every run stopped at iteration 2" in readme
    # the stop is part of the study: kept as finished, and not changed on a later start
    kept = subprocess.run(cmd + ["2"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    assert kept.returncode == 0 and "distppo seed 1: finished before, kept" in kept.stdout
    other = subprocess.run(cmd + ["3"], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=120)
    assert other.returncode != 0
    assert other.stderr.strip().splitlines() == [
        f"error: {out} holds a study with stop_at_iteration = 2, not 3: give the same value "
        "to continue it, or another --out"]
