"""`distppo report` on a real tiny sweep: numbers against pandas, aggregates against hand
computations, the reference join for all 57 games in both id forms, plots, bad input.

The sweep under tests/data/sweep-tiny/ was written by a real `distppo sweep` (command in its
README). Expected values are recomputed here from the Parquet files and the reference CSVs
with plain pandas, independently of distppo's report modules.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from distppo.report import aggregates, references

from helpers import REPO, assert_one_line_error, run_cli

SWEEP = os.path.join(REPO, "tests", "data", "sweep-tiny")
DATA = os.path.join(REPO, "distppo", "data")
REPS = "2000"  # bootstrap replicates: enough for stable intervals, fast
SECTIONS = {"ppo": "distppo ppo (envpool)", "ppo_lstm": "distppo ppo_lstm (envpool)"}
# The document each reference name's numbers come from (reference/README.md): its own doc,
# or for baselines the 57-game table it appears in.
RUNTIME_DOC = {
    "ppo_atari_envpool": "docs/benchmark/ppo_atari_envpool_runtimes.md",
    "ppo_atari_lstm": "docs/benchmark/ppo_atari_lstm_runtimes.md",
    "ppo_atari_envpool_xla_jax": "docs/benchmark/ppo_atari_envpool_xla_jax_runtimes.md",
    "baselines_ppo2_cnn": "docs/benchmark/ppo_atari_envpool_xla_jax_runtimes.md",
}
RETURN_DOC = {
    "ppo_atari_envpool": "docs/benchmark/ppo_atari_envpool.md",
    "ppo_atari_lstm": "docs/benchmark/ppo_atari_lstm.md",
    "ppo_atari_envpool_xla_jax": "docs/benchmark/ppo_atari_envpool_xla_jax.md",
    "baselines_ppo2_cnn": "docs/benchmark/ppo_atari_envpool_xla_jax.md",
}
DEFAULT_REFS = {"ppo": ["ppo_atari_envpool", "ppo_atari_envpool_xla_jax", "baselines_ppo2_cnn"],
                "ppo_lstm": ["ppo_atari_lstm", "ppo_atari_envpool_xla_jax", "baselines_ppo2_cnn"]}


# --- helpers ---------------------------------------------------------------------------------

def md_tables(path) -> dict[str, list[dict]]:
    """Every markdown table of a file, keyed by the `## heading` above it, rows as dicts."""
    tables, heading, lines = {}, "", open(path).read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("#"):
            heading = lines[i].lstrip("#").strip()
        rule = lines[i + 1] if i + 1 < len(lines) else ""
        if lines[i].startswith("| ") and rule.startswith(("| :---", "| ---:")):
            header = [c.strip() for c in lines[i].strip("|").split(" | ")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split(" | ")]
                rows.append(dict(zip(header, cells)))
                i += 1
            tables.setdefault(heading, rows)
            continue
        i += 1
    return tables


def ref_column(row: dict, name: str) -> str:
    """The header of reference `name` in a table row: the name, then at most a note mark."""
    return next(h for h in row if re.fullmatch(re.escape(name) + r"( \(note \d\))?", h))


def by_env(rows: list[dict]) -> dict[str, dict]:
    return {r["env_id"]: r for r in rows}


def pm(values) -> str:
    v = pd.Series(values, dtype=float).dropna()
    return "missing" if v.empty else f"{v.mean():.2f} ± {v.std(ddof=0):.2f}"


def ref_row(csv: str, name: str, env_id: str, doc: str):
    """The reference row of `name` for a game, whichever id form the doc printed; or None."""
    df = pd.read_csv(os.path.join(DATA, csv))
    gym = dict(pd.read_csv(os.path.join(DATA, "atari57_gym.csv")).values)
    v5 = env_id if env_id in gym else {g: v for v, g in gym.items()}[env_id]
    hit = df[(df["algo"] == name) & df["env_id"].isin([v5, gym[v5]]) & (df["source_doc"] == doc)]
    assert len(hit) <= 1, (name, env_id, doc)
    return hit.iloc[0] if len(hit) else None



@pytest.fixture(scope="session")
def sweep_files():
    trials = pd.read_parquet(os.path.join(SWEEP, "trials.parquet"))
    iters = pd.read_parquet(os.path.join(SWEEP, "iterations.parquet"))
    return trials, iters


@pytest.fixture(scope="session")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    proc = run_cli("report", SWEEP, "--out", out, "--bootstrap-reps", REPS, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def report_json(report_dir):
    return json.loads((report_dir / "report.json").read_text())


# --- the tables hold the right numbers --------------------------------------------------------

def test_fixture_is_a_sweep_with_gaps(sweep_files):
    """The committed sweep has what the report must handle: two algos, finished trials, a game
    that never finishes in the budget (Pong: NaN return), and the contract's columns: all of
    them but those the schema declares added after it was written (ADDED_LATER: readers fill
    them in; TRIAL_ADDED_LATER: the report says unknown), so the report is also tested on a
    sweep of an older distppo."""
    from distppo.report.load import ITERATION_COLUMNS, OPTIONAL_TRIAL_COLUMNS, TRIAL_COLUMNS
    from distppo.telemetry.schema import (
        ADDED_LATER,
        SWEEP_ITERATION_SCHEMA,
        TRIAL_ADDED_LATER,
        TRIAL_SCHEMA,
    )
    trials, iters = sweep_files
    assert set(TRIAL_COLUMNS) <= set(TRIAL_SCHEMA.names)
    assert set(TRIAL_SCHEMA.names) - set(trials.columns) == set(TRIAL_ADDED_LATER)
    assert set(TRIAL_ADDED_LATER) <= set(OPTIONAL_TRIAL_COLUMNS)
    assert set(ITERATION_COLUMNS) <= set(SWEEP_ITERATION_SCHEMA.names)
    assert set(SWEEP_ITERATION_SCHEMA.names) - set(iters.columns) == {"learner_recoveries"}
    assert "learner_recoveries" in ADDED_LATER
    assert set(trials["algo"]) == {"ppo", "ppo_lstm"}
    assert (trials["status"] == "done").sum() >= 8
    assert trials.loc[trials["env_id"] == "Pong-v5", "final_episodic_return"].isna().all()
    # trials.final_episodic_return is the last row's last-100 mean (CleanRL's metric).
    last = iters.sort_values("iteration").groupby("trial_id").tail(1).set_index("trial_id")
    done = trials[trials["status"] == "done"].set_index("trial_id")
    for trial_col, iter_col in (("final_episodic_return", "episodic_return_last100"),
                                ("final_envpool_return", "envpool_avg_return_last100"),
                                ("final_xla_return", "xla_avg_return_last100")):
        pd.testing.assert_series_equal(done[trial_col], last.loc[done.index, iter_col],
                                       check_names=False)


def test_runtimes_md_numbers(report_dir, sweep_files):
    trials, iters = sweep_files
    tables = md_tables(report_dir / "runtimes.md")
    text = (report_dir / "runtimes.md").read_text()
    assert "not the references' 10,000,000" in text and "scaled to 10M" in text
    for algo, label in SECTIONS.items():
        rows = by_env(tables[label])
        done = trials[(trials["algo"] == algo) & (trials["status"] == "done")]
        ratios = {name: [] for name in DEFAULT_REFS[algo]}
        for env_id, cell in done.groupby("env_id"):
            row = rows[env_id]
            assert row[label] == pm(cell["wall_clock_minutes"])
            assert row["seeds"] == f"{len(cell)}/2"
            scaled = cell["wall_clock_minutes"] * 10_000_000 / cell["total_timesteps"]
            assert row["scaled to 10M"] == pm(scaled)
            # CleanRL's figure: mean of the last 10% of each run's rows, then over seeds.
            tails = []
            for trial_id in cell["trial_id"]:
                wall = sorted(iters.loc[iters["trial_id"] == trial_id, "wall_clock_s"])
                k = math.ceil(len(wall) / 10)
                tails.append(sum(wall[-k:]) / k / 60)
            assert row["CleanRL def."] == pm(tails)
            for name in DEFAULT_REFS[algo]:
                ref = ref_row("runtimes.csv", name, env_id, RUNTIME_DOC[name])
                col = ref_column(row, name)   # the name, and "(note k)" unless the same run
                if ref is None:  # the 3-game CleanRL tables lack most games
                    assert row[col] == row[f"speed-up vs {name}"] == "—"
                    continue
                minutes = ref["minutes"]
                assert row[col] == f"{minutes:,.3f}"
                assert row[f"speed-up vs {name}"] == f"{minutes / scaled.mean():,.2f}"
                ratios[name].append(minutes / scaled.mean())
        for stat, fn in (("mean", np.mean), ("median", np.median)):
            summary = rows[f"**{stat} ratio**"]
            for name, values in ratios.items():
                n = len(values)
                games = f"{n} game{'s' * (n != 1)}"
                assert summary[f"speed-up vs {name}"] == f"{fn(values):,.2f} ({games})"


# The statistic of each reference's return column (reference README, "Return metric") and the
# heading words the report gives it; our column computed the same way.
STATISTIC = {"ppo_atari_lstm": "last 100 games", "baselines_ppo2_cnn": "last 100 games",
             "ppo_atari_envpool": "ppo_atari_envpool's avg_episodic_return",
             "ppo_atari_envpool_xla_jax": "ppo_atari_envpool_xla_jax's avg_episodic_return"}
OUR_COLUMN = {"last 100 games": "final_episodic_return",
              "ppo_atari_envpool's avg_episodic_return": "final_envpool_return",
              "ppo_atari_envpool_xla_jax's avg_episodic_return": "final_xla_return"}


def check_returns_md(path, trials, sweep_has_columns):
    """Every statistic table of every section: ours against pandas, references against the
    CSV, and the statistic named in the headers."""
    tables = md_tables(path)
    for algo, label in SECTIONS.items():
        done = trials[(trials["algo"] == algo) & (trials["status"] == "done")]
        for stat in dict.fromkeys(["last 100 games"] + [STATISTIC[n] for n in DEFAULT_REFS[algo]]):
            rows = by_env(tables[f"{label}: {stat}"])
            ours = f"{label} [{stat}]"
            assert set(rows) == set(trials["env_id"])
            for env_id, cell in done.groupby("env_id"):
                recorded = stat == "last 100 games" or sweep_has_columns
                returns = cell[OUR_COLUMN[stat]] if recorded else None
                assert rows[env_id][ours] == (pm(returns) if recorded else "not recorded")
                assert rows[env_id]["seeds"] == (f"{returns.notna().sum()}/2" if recorded
                                                 else "—")
                for name in (n for n in DEFAULT_REFS[algo] if STATISTIC[n] == stat):
                    ref = ref_row("returns.csv", name, env_id, RETURN_DOC[name])
                    assert ref is None or ref["statistic"] in (
                        "last100_games", "envpool_avg20", "xla_latest_per_env")
                    header = next(h for h in rows[env_id] if h.startswith(f"{name} [{stat}]"))
                    assert rows[env_id][header] == (
                        "—" if ref is None else f"{ref['mean']:.2f} ± {ref['std']:.2f}")
    return tables


def test_returns_md_numbers(report_dir, sweep_files):
    trials, _ = sweep_files
    tables = check_returns_md(report_dir / "returns.md", trials, sweep_has_columns=True)
    ppo = SECTIONS["ppo"]
    assert by_env(tables[f"{ppo}: last 100 games"])["Pong-v5"][f"{ppo} [last 100 games]"] == (
        "missing")
    text = (report_dir / "returns.md").read_text()
    assert "Pong-v5 seed 1: finished without a completed game" in text
    assert "not recorded" not in text


def test_returns_md_pairings(report_dir, report_json):
    """Each section says which references are the same experiment and why the others are not;
    PPO-LSTM on EnvPool has no CleanRL counterpart."""
    text = (report_dir / "returns.md").read_text()
    lstm = text[text.index(f"## {SECTIONS['ppo_lstm']}"):]
    assert lstm.startswith(f"## {SECTIONS['ppo_lstm']}\n\n**No CleanRL counterpart**")
    assert "`ppo_atari_lstm`: no CleanRL counterpart" in lstm
    sections = {s["algo"]: s for s in report_json["sections"]}
    assert sections["ppo_lstm"]["no_counterpart"] and not sections["ppo"]["no_counterpart"]
    # the tiny sweep ran 4 envs x 64 steps: not even ppo_atari_envpool is the same experiment
    assert sections["ppo"]["pairings"]["ppo_atari_envpool"] == (
        "not the same experiment: settings --num-envs 4, --num-steps 64, --num-minibatches 2, "
        "--update-epochs 1")
    assert "JAX" in sections["ppo"]["pairings"]["ppo_atari_envpool_xla_jax"]
    for name, note in sections["ppo"]["pairings"].items():
        header = next(h for h in md_tables(report_dir / "returns.md")[
            f"{SECTIONS['ppo']}: {STATISTIC[name]}"][0] if h.startswith(name))
        k = re.search(r"\(note (\d)\)", header).group(1)
        assert f"- note {k}, `{name}`: {note}" in text


def test_returns_md_of_a_sweep_before_the_statistic_columns(tmp_path, sweep_files):
    """A sweep written before final_envpool_return / final_xla_return existed: their tables
    say "not recorded" and why; a null in a column counts as no value, like NaN."""
    trials, iters = sweep_files
    sweep = tmp_path / "sweep"
    shutil.copytree(SWEEP, sweep)
    old = trials.drop(columns=["final_envpool_return", "final_xla_return"])
    old = old.astype({"final_episodic_return": "Float64"})   # NaN written as null
    old.loc[old["final_episodic_return"].isna(), "final_episodic_return"] = pd.NA
    old.to_parquet(sweep / "trials.parquet", index=False)
    iters.drop(columns=["envpool_avg_return_last100", "xla_avg_return_last100"]).to_parquet(
        sweep / "iterations.parquet", index=False)
    proc = run_cli("report", sweep, "--out", tmp_path / "out", "--bootstrap-reps", "200",
                   "--no-plots")
    assert proc.returncode == 0, proc.stderr[-2000:]
    check_returns_md(tmp_path / "out" / "returns.md", trials, sweep_has_columns=False)
    text = (tmp_path / "out" / "returns.md").read_text()
    assert "predate the `final_envpool_return` column" in text


def _slow_iqm(values):
    s = sorted(values)
    cut = int(len(s) * 0.25)
    middle = s[cut:len(s) - cut]
    return sum(middle) / len(middle)


def test_summary_hns_and_aggregates(report_dir, report_json, sweep_files):
    trials, _ = sweep_files
    hns = pd.read_csv(os.path.join(DATA, "hns.csv")).set_index("env")
    tables = md_tables(report_dir / "summary.md")
    for sec in report_json["sections"]:
        algo = sec["algo"]
        done = trials[(trials["algo"] == algo) & (trials["status"] == "done")].sort_values("seed")
        rows = by_env(tables[f"Human-normalised scores: {SECTIONS[algo]}"])
        columns = []
        for env_id, cell in done.groupby("env_id"):
            rand, human = hns.loc[env_id, "random"], hns.loc[env_id, "human"]
            per_seed = [(s, (r - rand) / (human - rand))
                        for s, r in zip(cell["seed"], cell["final_episodic_return"])]
            finite = [v for _, v in per_seed if not math.isnan(v)]
            expected = "; ".join(f"{s}: —" if math.isnan(v) else f"{s}: {v:.3f}"
                                 for s, v in per_seed)
            assert rows[env_id]["per seed"].replace(", ", "; ") == expected
            if finite:
                assert rows[env_id]["HNS"] == f"{np.mean(finite):.3f} ± {np.std(finite):.3f}"
                columns.append(finite)
        k = min(len(c) for c in columns)
        matrix = [[c[i] for c in columns] for i in range(k)]  # [runs, games]
        flat = [x for run in matrix for x in run]
        game_means = [sum(run[g] for run in matrix) / k for g in range(len(columns))]
        expected = {"median": float(np.median(game_means)), "iqm": _slow_iqm(flat),
                    "mean": sum(game_means) / len(game_means),
                    "optimality_gap": 1 - sum(min(x, 1.0) for x in flat) / len(flat)}
        metrics = sec["aggregates"]["metrics"]
        md_rows = {r["metric"]: r for r in tables[f"HNS aggregates: {SECTIONS[algo]}"]}
        for name, value in expected.items():
            assert metrics[name]["point"] == pytest.approx(value, abs=1e-12)
            lo, point, hi = (metrics[name][k] for k in ("lo", "point", "hi"))
            assert lo - 1e-12 <= point <= hi + 1e-12
            assert md_rows[name]["HNS"] == f"{value:.3f}"
            assert md_rows[name]["95% CI"] == f"[{lo:.3f}, {hi:.3f}]"
        assert sec["aggregates"]["runs_per_game"] == k
        assert sec["aggregates"]["excluded"] == [
            {"env_id": "Pong-v5", "reason": "no finished run with a return"}]
    summary = (report_dir / "summary.md").read_text()
    assert "| games present | 3 (3 of the Atari-57 games) |" in summary
    assert "| seeds | 1, 2 |" in summary
    hours = trials["wall_clock_minutes"].sum() / 60
    assert f"| total trial time | {hours:.3f} h" in summary
    assert "| total GPU-hours | 0 h (no trial ran on a GPU) |" in summary
    # written before preemptions were counted apart: unknown, never 0
    assert "| trial preemptions (not failures) | — |" in summary


def _numbers(obj) -> list[float]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v)]
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return [float(obj)]
    return []


def test_report_json_holds_every_table_number(report_dir, report_json):
    known = _numbers(report_json)
    for md in ("runtimes.md", "returns.md", "summary.md"):
        for rows in md_tables(report_dir / md).values():
            for row in rows:
                for cell in row.values():
                    for token in re.findall(r"-?[\d,]*\d\.\d+", cell):
                        value, digits = float(token.replace(",", "")), len(token.split(".")[1])
                        assert any(abs(round(x, digits) - value) < 0.6 * 10 ** -digits
                                   for x in known), f"{md}: {token} in {cell!r} not in report.json"


def test_plots_are_real_images(report_dir):
    from matplotlib import image
    for name in ("learning_curves.png", "learning_curves_time.png", "runtimes.png"):
        pixels = image.imread(report_dir / name)[..., :3]  # [H, W, RGB] floats in [0, 1]
        assert pixels.shape[0] >= 250 and pixels.shape[1] >= 500, (name, pixels.shape)
        assert pixels.std() > 0.05, name  # not a blank canvas
        colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
        assert len(colours) > 50, name  # lines, bands, text: many distinct colours


def test_cleanrl_runtime_is_the_last_tenth_of_rows():
    from distppo.report.load import cleanrl_minutes
    wall = pd.Series([60.0 * i for i in range(1, 21)])  # 20 rows, 1..20 minutes
    assert cleanrl_minutes(wall) == 19.5                # mean of the last 2 rows
    assert cleanrl_minutes(wall[:5]) == 5.0             # under 10 rows: the last row
    assert math.isnan(cleanrl_minutes(pd.Series([], dtype=float)))


# --- reference join ---------------------------------------------------------------------------

def test_reference_join_all_57_games_both_id_forms():
    games = [g.strip() for g in open(os.path.join(DATA, "atari57.txt")) if g.strip()]
    gym = dict(pd.read_csv(os.path.join(DATA, "atari57_gym.csv")).values)
    hns = pd.read_csv(os.path.join(DATA, "hns.csv")).set_index("env")
    assert len(games) == 57
    for v5 in games:
        for env_id in (v5, gym[v5]):
            for name in ("ppo_atari_envpool_xla_jax", "baselines_ppo2_cnn"):
                expected = ref_row("runtimes.csv", name, v5, RUNTIME_DOC[name])
                assert references.runtime(name, env_id).minutes == expected["minutes"]
                expected = ref_row("returns.csv", name, v5, RETURN_DOC[name])
                got = references.episodic_return(name, env_id)
                assert (got.mean, got.std) == (expected["mean"], expected["std"])
            assert references.hns_table()[references.game_key(env_id)] == (
                hns.loc[v5, "random"], hns.loc[v5, "human"])
    # The 3-game gym tables print NoFrameskip-v4 ids; a v5 id finds them and vice versa.
    assert references.runtime("ppo_atari", "Breakout-v5").minutes == 264.077
    assert references.episodic_return("ppo_atari_envpool", "BreakoutNoFrameskip-v4").mean == 211.24
    assert references.runtime("ppo_atari", "CartPole-v1") is None


def test_report_of_gym_ids_joins_the_same_references(tmp_path, report_dir):
    """The same sweep with NoFrameskip-v4 ids gives the same reference columns."""
    gym = dict(pd.read_csv(os.path.join(DATA, "atari57_gym.csv")).values)
    sweep = tmp_path / "sweep-gym-ids"
    sweep.mkdir()
    for name in ("trials.parquet", "iterations.parquet"):
        df = pd.read_parquet(os.path.join(SWEEP, name))
        df["env_id"] = df["env_id"].map(gym)
        df.to_parquet(sweep / name, index=False)
    proc = run_cli("report", sweep, "--out", tmp_path / "out", "--bootstrap-reps", "200",
                   "--no-plots")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for md in ("runtimes.md", "returns.md"):
        ours, theirs = md_tables(report_dir / md), md_tables(tmp_path / "out" / md)
        headings = [h for h in ours if h.startswith(tuple(SECTIONS.values()))]
        assert len(headings) >= 2
        for heading in headings:   # runtimes: a section; returns: a section's statistic
            for v5, row in by_env(ours[heading]).items():
                if v5 in gym:
                    assert by_env(theirs[heading])[gym[v5]] == {**row, "env_id": gym[v5]}


# --- aggregates against hand-computed values --------------------------------------------------

def test_aggregates_hand_computed():
    scores = [[0.0, 2.0, 0.5],    # run 1 on games a, b, c
              [1.0, 4.0, 1.5]]    # run 2
    # per-game means 0.5, 3.0, 1.0 -> median 1.0, mean 1.5
    assert aggregates.median(scores) == 1.0
    assert aggregates.mean(scores) == 1.5
    # pooled sorted: 0, 0.5, 1, 1.5, 2, 4; int(0.25 * 6) = 1 cut each end -> mean(0.5, 1, 1.5, 2)
    assert aggregates.iqm(scores) == 1.25
    # min(x, 1): 0, 1, 0.5, 1, 1, 1 -> mean 4.5 / 6 = 0.75 -> gap 0.25
    assert aggregates.optimality_gap(scores) == pytest.approx(0.25)
    # 8 values: cut 2 each end; 7 values: int(1.75) = 1 cut each end -> mean(1, 2, 3, 4, 10)
    assert aggregates.iqm([[8, 1, 2, 7], [3, 6, 5, 4]]) == 4.5
    assert aggregates.iqm([[0, 1, 2, 3, 4, 10, 100]]) == 4.0
    # HNS of Breakout (random 1.7, human 30.5): the human score maps to 1, random to 0.
    assert aggregates.human_normalized(30.5, 1.7, 30.5) == 1.0
    assert aggregates.human_normalized(16.1, 1.7, 30.5) == pytest.approx(0.5)


def test_bootstrap_contains_point_shrinks_and_is_stratified():
    rng = np.random.default_rng(1)
    few = rng.normal(1.0, 0.5, size=(3, 10))    # [runs, games]
    many = rng.normal(1.0, 0.5, size=(30, 10))
    est_few = aggregates.interval_estimates(few, reps=4000, seed=0)
    est_many = aggregates.interval_estimates(many, reps=4000, seed=0)
    for name in aggregates.AGGREGATES:
        for est in (est_few, est_many):
            assert est[name]["lo"] <= est[name]["point"] <= est[name]["hi"], name
        assert (est_many[name]["hi"] - est_many[name]["lo"]
                < 0.7 * (est_few[name]["hi"] - est_few[name]["lo"])), name
    # Stratified: runs are resampled within their game, so games whose runs agree give a
    # zero-width interval (resampling pooled runs across games would not).
    constant = np.array([[0.0, 1.0, 3.0]] * 4)
    for name, est in aggregates.interval_estimates(constant, reps=500).items():
        assert est["lo"] == est["hi"] == pytest.approx(est["point"]), name
    diff = aggregates.difference_estimates(constant, constant + 0.5, reps=500)
    assert diff["mean"] == {"point": 0.5, "lo": 0.5, "hi": 0.5}
    # ...and each game is resampled on its own: two runs whose game scores cancel out keep a
    # constant mean only if both games draw the same run, which stratification does not do.
    crossed = np.array([[0.0, 1.0], [1.0, 0.0]])
    est = aggregates.interval_estimates(crossed, reps=2000)["mean"]
    assert est["point"] == 0.5 and est["lo"] < 0.5 < est["hi"]


# --- partial sweeps, compare, URIs -------------------------------------------------------------

def test_partial_sweep_shows_missing_runs(tmp_path, sweep_files):
    trials, iters = sweep_files
    sweep = tmp_path / "partial"
    sweep.mkdir()
    # Breakout ppo seed 2: iteration rows but no trial row (still running); Pong ppo seed 1 failed.
    cell = (trials["env_id"] == "Breakout-v5") & (trials["algo"] == "ppo") & (trials["seed"] == 2)
    cut = trials[~cell].copy()
    failed = (cut["env_id"] == "Pong-v5") & (cut["algo"] == "ppo") & (cut["seed"] == 1)
    cut.loc[failed, "status"] = "failed"
    cut.to_parquet(sweep / "trials.parquet", index=False)
    iters.to_parquet(sweep / "iterations.parquet", index=False)
    shutil.copy(os.path.join(SWEEP, "sweep.json"), sweep / "sweep.json")
    proc = run_cli("report", sweep, "--out", tmp_path / "out", "--bootstrap-reps", "200",
                   "--no-plots")
    assert proc.returncode == 0, proc.stderr[-2000:]
    runtimes = (tmp_path / "out" / "runtimes.md").read_text()
    assert "- Breakout-v5 seed 2: unfinished: iteration rows but no trial row" in runtimes
    assert "- Pong-v5 seed 1: status failed" in runtimes
    rows = by_env(md_tables(tmp_path / "out" / "runtimes.md")[SECTIONS["ppo"]])
    assert rows["Breakout-v5"]["seeds"] == "1/2" and rows["Pong-v5"]["seeds"] == "1/2"
    assert rows["Qbert-v5"]["seeds"] == "2/2"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {(m["algo"], m["env_id"], m["seed"]) for m in report["missing"]} == {
        ("ppo", "Breakout-v5", 2), ("ppo", "Pong-v5", 1)}
    ppo = report["sections"][0]
    assert ppo["aggregates"]["runs_per_game"] == 1
    summary = (tmp_path / "out" / "summary.md").read_text()
    # Qbert keeps seed 1 only, so both games enter the aggregates with one run each.
    assert "1 run left out so every game has 1 (lowest seeds kept)" in summary
    assert "| ppo | envpool | Pong-v5 | 1 | status failed |" in summary


def test_sweep_wall_clock_from_file_times(tmp_path):
    """sweep.json is written when the sweep starts, trials.parquet when trials finish."""
    from distppo.report import load as sweepdata
    for name in ("trials.parquet", "iterations.parquet", "sweep.json"):
        shutil.copy(os.path.join(SWEEP, name), tmp_path / name)
    os.utime(tmp_path / "sweep.json", (1_700_000_000, 1_700_000_000))
    os.utime(tmp_path / "trials.parquet", (1_700_005_400, 1_700_005_400))
    assert sweepdata.load(str(tmp_path)).span_s == 5400.0
    os.utime(tmp_path / "sweep.json", (1_700_009_000, 1_700_009_000))  # copied after: unknown
    assert math.isnan(sweepdata.load(str(tmp_path)).span_s)


def test_compare_two_algos(tmp_path, sweep_files):
    trials, _ = sweep_files
    proc = run_cli("report", "--compare", SWEEP, SWEEP, "--algos", "ppo", "ppo_lstm",
                   "--out", tmp_path, "--bootstrap-reps", REPS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    heading = "Compare: A = ppo (envpool) vs B = ppo_lstm (envpool)"
    rows = by_env(md_tables(tmp_path / "compare.md")[heading])
    done = trials[trials["status"] == "done"]
    minutes = done.pivot_table(index="env_id", columns="algo", values="wall_clock_minutes")
    returns = done.pivot_table(index="env_id", columns="algo", values="final_episodic_return")
    for env_id in minutes.index:
        ratio = minutes.loc[env_id, "ppo_lstm"] / minutes.loc[env_id, "ppo"]
        assert rows[env_id]["minutes B/A"] == f"{ratio:.3f}"
        if env_id in returns.index and not returns.loc[env_id].isna().any():
            ratio = returns.loc[env_id, "ppo_lstm"] / returns.loc[env_id, "ppo"]
            assert rows[env_id]["return B/A"] == f"{ratio:.3f}"
    result = json.loads((tmp_path / "compare.json").read_text())
    geo = math.exp(np.mean(np.log(minutes["ppo_lstm"] / minutes["ppo"])))
    assert result["minutes_ratio_geomean"]["point"] == pytest.approx(geo)
    for name, d in result["hns_difference"]["difference"].items():
        a, b = result["hns_difference"]["a"][name], result["hns_difference"]["b"][name]
        assert d["point"] == pytest.approx(b["point"] - a["point"])
        assert d["lo"] <= d["point"] <= d["hi"], name
    assert "## Aggregate difference" in (tmp_path / "compare.md").read_text()


def test_file_uri_and_ray_free(tmp_path):
    """A file:// URI reads like a path, in a process where importing Ray fails."""
    code = ("import sys; sys.modules['ray'] = None\n"
            "from distppo.report.write import write_report\n"
            f"print(write_report('file://{SWEEP}', {str(tmp_path)!r}, reps=200, plots=False))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["sweep"]["uri"] == f"file://{SWEEP}" and report["sweep"]["name"] == "sweep-tiny"


def test_s3_sweep_on_a_loopback_server(tmp_path):
    """s3:// in and out, against a real S3 API (moto's server) on 127.0.0.1."""
    server_mod = pytest.importorskip("moto.server")
    import pyarrow.fs as pafs
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        s3 = pafs.S3FileSystem(endpoint_override=f"http://{host}:{port}", scheme="http",
                               access_key="testing", secret_key="testing", region="us-east-1",
                               allow_bucket_creation=True)
        s3.create_dir("bucket")
        for name in ("trials.parquet", "iterations.parquet", "sweep.json"):
            pafs.copy_files(os.path.join(SWEEP, name), f"bucket/sweeps/tiny/{name}",
                            destination_filesystem=s3)
        proc = run_cli("report", "s3://bucket/sweeps/tiny", "--out", "s3://bucket/reports/tiny",
                       "--bootstrap-reps", "200", "--no-plots", env=creds)
        assert proc.returncode == 0, proc.stderr[-2000:]
        written = {os.path.basename(i.path) for i in
                   s3.get_file_info(pafs.FileSelector("bucket/reports/tiny"))}
        assert written == {"report.json", "returns.md", "runtimes.md", "summary.md"}
        with s3.open_input_stream("bucket/reports/tiny/report.json") as f:
            report = json.loads(f.readall())
        assert report["sweep"]["uri"] == "s3://bucket/sweeps/tiny"
        assert report["sweep"]["finished_runs"] == 12
    finally:
        server.stop()


# --- bad input: one line on stderr, non-zero exit, no traceback --------------------------------

def test_folder_without_parquet(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli("report", tmp_path / "empty", "--out", tmp_path / "out")
    assert_one_line_error(proc, "has no trials.parquet", "distppo sweep")


def test_missing_folder(tmp_path):
    assert_one_line_error(run_cli("report", tmp_path / "nope", "--out", tmp_path / "out"),
                          "does not exist")


def test_parquet_missing_a_column(tmp_path, sweep_files):
    trials, iters = sweep_files
    trials.drop(columns=["final_episodic_return"]).to_parquet(tmp_path / "trials.parquet")
    iters.to_parquet(tmp_path / "iterations.parquet")
    proc = run_cli("report", tmp_path, "--out", tmp_path / "out")
    assert_one_line_error(proc, "trials.parquet lacks column(s) final_episodic_return")


def test_not_parquet(tmp_path):
    (tmp_path / "trials.parquet").write_text("trial_id,env_id\n")
    proc = run_cli("report", tmp_path, "--out", tmp_path / "out")
    assert_one_line_error(proc, "trials.parquet")


def test_unknown_reference_lists_valid_names(tmp_path):
    proc = run_cli("report", SWEEP, "--out", tmp_path, "--reference", "ppo_atari_jax")
    assert_one_line_error(proc, "unknown reference 'ppo_atari_jax'", *references.names())
    assert not any(tmp_path.iterdir()), "a rejected report writes nothing"


@pytest.mark.parametrize("args, needle", [
    ([], "give either one SWEEP folder or --compare A B"),
    (["--compare", SWEEP, SWEEP], "pick one per sweep with --algos"),
    (["--compare", SWEEP, SWEEP, "--algos", "ppo", "dqn"], "has no algo 'dqn'"),
    ([SWEEP, "--algos", "ppo", "ppo"], "--algos only applies with --compare"),
    ([SWEEP, "--bootstrap-reps", "5"], "--bootstrap-reps must be at least 100"),
])
def test_bad_arguments(tmp_path, args, needle):
    assert_one_line_error(run_cli("report", *args, "--out", tmp_path / "out"), needle)
