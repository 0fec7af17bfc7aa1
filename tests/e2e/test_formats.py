"""Our Parquet files read the same in pyarrow, pandas, polars and DuckDB: "no value" is a null,
which all four skip in an aggregate (NaN would poison DuckDB's and polars' averages)."""
from __future__ import annotations

import pyarrow.parquet as pq

from helpers import assert_engines_agree, run_cli

NO_VALUE_EARLY = ("episodic_return_mean", "episodic_length_mean", "episodic_return_last100")


def test_run_metrics_aggregate_the_same_in_every_engine(tmp_path):
    # CartPole, 2 envs x 8 steps: the first iteration finishes no game, later ones do.
    proc = run_cli("train", "--local", "--env-id", "CartPole-v1", "--backend", "gym",
                   "--num-envs", "2", "--num-steps", "8", "--num-minibatches", "2",
                   "--total-timesteps", "96", "--output-dir", tmp_path, "--run-name", "r",
                   timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "r" / "metrics.parquet"
    assert_engines_agree(path, must_have_nulls=NO_VALUE_EARLY)
    first = pq.read_table(path).slice(0, 1).to_pylist()[0]
    assert first["episodes"] == 0 and first["episodic_return_mean"] is None
