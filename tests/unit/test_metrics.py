"""telemetry/ against real files: Parquet and TensorBoard event files read back."""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from distppo.errors import UserError
from distppo.telemetry import parquet, schema, stats, tensorboard
from distppo.telemetry.parquet import ParquetSink
from distppo.telemetry.progress import Progress, format_eta
from distppo.telemetry.runlayout import METRICS
from distppo.telemetry.schema import (
    COLUMN_NAMES,
    ITERATION_SCHEMA,
    LOSS_COLUMNS,
    schema_markdown,
    validate_row,
)
from distppo.telemetry.stats import EpisodeTracker, PhaseTimer, ReferenceReturns
from distppo.telemetry.tensorboard import TensorBoardWriter

from helpers import make_row

ROOT = Path(__file__).resolve().parents[2]

EXPECTED_COLUMNS = (
    "run_id env_id algo backend seed iteration global_step wall_clock_s sps "
    "episodic_return_mean episodic_length_mean episodes episodic_return_last100 "
    "envpool_avg_return_last100 xla_avg_return_last100 learning_rate "
    "policy_loss value_loss entropy old_approx_kl approx_kl clipfrac explained_variance "
    "t_env_s t_infer_s t_learn_s t_transfer_s t_wait_s t_checkpoint_s t_iteration_s "
    "num_env_runners num_learners learner_threads runner_threads policy_lag runner_restarts "
    "learner_recoveries "
    "runner_env_s_mean runner_env_s_max "
    "runner_infer_s_mean runner_infer_s_max").split()


def read_iterations(path) -> list[int]:
    return pd.read_parquet(path)["iteration"].tolist()


# --- schema ---------------------------------------------------------------------------------

def test_schema_columns_in_declared_order():
    assert COLUMN_NAMES == tuple(EXPECTED_COLUMNS)
    assert ITERATION_SCHEMA.names == EXPECTED_COLUMNS
    assert set(LOSS_COLUMNS) <= set(COLUMN_NAMES)
    assert schema.PHASES == ("env", "infer", "learn", "transfer", "wait", "checkpoint",
                              "iteration")


def test_validate_row_names_missing_and_unknown_keys():
    row = make_row(1)
    del row["approx_kl"]
    with pytest.raises(ValueError, match="missing.*approx_kl"):
        validate_row(row)
    with pytest.raises(ValueError, match="unknown.*charts/SPS"):
        validate_row({**make_row(1), "charts/SPS": 1.0})


def test_validate_row_checks_and_coerces_types():
    with pytest.raises(ValueError, match="'seed' expects int64"):
        validate_row(make_row(1, seed="1"))
    with pytest.raises(ValueError, match="'episodes' expects int64"):
        validate_row(make_row(1, episodes=True))
    with pytest.raises(ValueError, match="'sps' expects float64"):
        validate_row(make_row(1, sps=None))
    with pytest.raises(ValueError, match="'run_id' expects string"):
        validate_row(make_row(1, run_id=3))
    out = validate_row(make_row(1, seed=np.int64(7), entropy=torch.tensor(1.5),
                                approx_kl=np.float32(0.5)))
    assert (type(out["seed"]), out["seed"]) == (int, 7)
    assert (type(out["entropy"]), out["entropy"]) == (float, 1.5)
    assert (type(out["approx_kl"]), out["approx_kl"]) == (float, 0.5)


def test_validate_row_turns_no_value_into_null():
    out = validate_row(make_row(1, episodic_return_mean=math.nan, episodic_length_mean=None,
                                episodic_return_last100=np.float32("nan"),
                                explained_variance=torch.tensor(float("nan")),
                                value_loss=math.nan))
    assert out["episodic_return_mean"] is None and out["episodic_length_mean"] is None
    assert out["episodic_return_last100"] is None and out["explained_variance"] is None
    assert math.isnan(out["value_loss"])  # a computed NaN (diverged loss) stays NaN
    nullable = {f.name for f in ITERATION_SCHEMA if f.nullable}
    assert nullable == {"episodic_return_mean", "episodic_length_mean",
                        "episodic_return_last100", "envpool_avg_return_last100",
                        "explained_variance"}


# --- ParquetSink ----------------------------------------------------------------------------

def test_parquet_reads_back_with_declared_dtypes(tmp_path):
    path = tmp_path / "run" / METRICS
    sink = ParquetSink(path)
    for i in (1, 2):
        sink.write(make_row(i, episodic_return_mean=math.nan))
    assert pq.read_schema(path).equals(ITERATION_SCHEMA)
    df = pd.read_parquet(path)
    assert list(df.columns) == EXPECTED_COLUMNS
    for c in schema.COLUMNS:
        kind = {"string": "string", "int64": "int64", "double": "float64"}[str(c.dtype)]
        if kind == "string":
            assert pd.api.types.is_string_dtype(df[c.name]), c.name
        else:
            assert df[c.name].dtype == np.dtype(kind), c.name
    assert df["global_step"].tolist() == [1024, 2048]
    assert df["sps"].tolist() == [1.25, 2.25]
    assert df["episodic_return_mean"].isna().all()  # no value: not a dropped row or 0
    # ... and stored as a Parquet null, not NaN (DuckDB and polars would average a NaN)
    column = pq.read_table(path)["episodic_return_mean"]
    assert column.null_count == 2 and ITERATION_SCHEMA.field("episodic_return_mean").nullable


def test_parquet_rewrite_of_same_iteration_replaces_row(tmp_path):
    path = tmp_path / "metrics.parquet"
    sink = ParquetSink(path)
    for i in (1, 2, 3):
        sink.write(make_row(i))
    sink.write(make_row(2, sps=99.0))
    sink.write(make_row(2, run_id="other_run"))  # another run's iteration 2 is a separate row
    df = pd.read_parquet(path)
    assert len(df) == 4
    mine = df[df["run_id"] == "Breakout__t__1__0"]
    assert mine["iteration"].tolist() == [1, 2, 3]
    assert mine.set_index("iteration")["sps"].tolist() == [1.25, 99.0, 3.25]


def test_parquet_truncate_after(tmp_path):
    path = tmp_path / "metrics.parquet"
    sink = ParquetSink(path)
    for i in range(1, 6):
        sink.write(make_row(i))
    sink.truncate_after(3)
    assert read_iterations(path) == [1, 2, 3]


def test_parquet_resume_reloads_earlier_rows(tmp_path):
    path = tmp_path / "metrics.parquet"
    first = ParquetSink(path)
    for i in range(1, 5):
        first.write(make_row(i))
    # The run crashed after iteration 4; its last checkpoint was at iteration 2.
    resumed = ParquetSink(path)
    assert [r["iteration"] for r in resumed.rows()] == [1, 2, 3, 4]
    resumed.truncate_after(2)
    resumed.write(make_row(3, sps=7.0))
    df = pd.read_parquet(path)
    assert df["iteration"].tolist() == [1, 2, 3]
    assert df["sps"].tolist() == [1.25, 2.25, 7.0]


def test_parquet_failed_flush_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.parquet"
    sink = ParquetSink(path)
    sink.write(make_row(1))

    def crash_midway(table, where, **kw):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(parquet.pq, "write_table", crash_midway)
    with pytest.raises(OSError):
        sink.write(make_row(2))
    monkeypatch.undo()
    assert read_iterations(path) == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.parquet"]
    sink.flush()
    assert read_iterations(path) == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.parquet"]


def test_parquet_tail_rows_cost_no_rewrite_and_read_back_exactly(tmp_path):
    path = tmp_path / "metrics.parquet"
    sink = ParquetSink(path)
    sink.write(make_row(1))
    committed = path.stat()
    for i in range(2, 52):
        sink.write(make_row(i, sps=0.1 + 0.2 * i, episodic_return_mean=math.nan), flush=False)
    after = path.stat()
    # O(1) per row: metrics.parquet was not rewritten, one line per row went to the tail
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        committed.st_ino, committed.st_mtime_ns, committed.st_size)
    assert len(parquet.tail_path(path).read_text().splitlines()) == 50
    assert read_iterations(path) == [1]
    table = parquet.read_metrics(path)
    assert table.schema.equals(ITERATION_SCHEMA)
    assert table["iteration"].to_pylist() == list(range(1, 52))
    assert table["sps"].to_pylist()[1:] == [0.1 + 0.2 * i for i in range(2, 52)]  # exact
    # no game finished: a null (validate_row), through the tail too
    assert table["episodic_return_mean"].to_pylist()[1:] == [None] * 50
    # what a resumed run starts from
    assert repr(ParquetSink(path).rows()) == repr(sink.rows())
    sink.flush()
    assert not parquet.tail_path(path).exists()
    assert read_iterations(path) == list(range(1, 52))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.parquet"]


def test_parquet_tail_torn_line_and_replay_after_a_crash(tmp_path):
    path, tail = tmp_path / "metrics.parquet", parquet.tail_path(tmp_path / "metrics.parquet")
    sink = ParquetSink(path)
    for i in (1, 2):
        sink.write(make_row(i), flush=False)
    sink.close()
    with open(tail, "a") as f:  # a writer killed in the middle of its line
        f.write('{"run_id": "Breakout__t__1__0", "iterat')
    assert [r["iteration"] for r in parquet.read_rows(path)] == [1, 2]
    sink = ParquetSink(path)
    sink.write(make_row(3), flush=False)  # cuts the torn line first
    assert [r["iteration"] for r in parquet.read_rows(path)] == [1, 2, 3]
    # killed after metrics.parquet was replaced but before the tail was emptied: replaying
    # the tail gives the same rows, once each
    lines = tail.read_text()
    sink.flush()
    tail.write_text(lines)
    assert [r["iteration"] for r in parquet.read_rows(path)] == [1, 2, 3]
    tail.write_text(lines.replace('"iteration": 2', '"iteration": "two"'))
    with pytest.raises(UserError, match="line 2 is damaged"):
        ParquetSink(path)


@pytest.mark.parametrize("damage", [b"", b"PAR1 half a file"])
def test_parquet_damaged_file_is_one_user_error(tmp_path, damage):
    path = tmp_path / "metrics.parquet"
    path.write_bytes(damage)
    with pytest.raises(UserError, match="metrics.parquet cannot be read .* damaged"):
        ParquetSink(path)


# --- PhaseTimer -----------------------------------------------------------------------------

def test_phase_timer_sums_resets_and_fills_all_columns(monkeypatch):
    clock = iter([10.0, 10.5, 20.0, 21.25, 30.0, 34.0])
    monkeypatch.setattr(stats.time, "perf_counter", lambda: next(clock))
    timer = PhaseTimer()
    with timer.phase("env"):
        pass
    with timer.phase("env"):
        pass
    with pytest.raises(RuntimeError):
        with timer.phase("learn"):  # time spent before an error still counts
            raise RuntimeError
    timer.add("wait", 0.125)
    assert timer.totals == {"env": 1.75, "learn": 4.0, "wait": 0.125}
    cols = timer.as_columns()
    assert list(cols) == [n for n in COLUMN_NAMES if n.startswith("t_")]
    assert (cols["t_env_s"], cols["t_learn_s"], cols["t_wait_s"], cols["t_infer_s"]) == (
        1.75, 4.0, 0.125, 0.0)
    timer.reset()
    assert set(timer.as_columns().values()) == {0.0}
    with pytest.raises(ValueError, match="unknown phase 'enviroment'"):
        with timer.phase("enviroment"):
            pass


# --- TensorBoard ----------------------------------------------------------------------------

def test_tensorboard_scalars_and_hparams_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoardWriter(tmp_path)
    tb.add_hparams_text({"exp_name": "t", "ppo": {"gamma": 0.99}, "env": {"num_envs": 8}})
    tb.write(make_row(1), episodes=[(10.0, 100), (30.0, 300)])
    tb.write(make_row(2), episodes=None)
    tb.write(make_row(3), episodes=[(5.0, 50)])
    tb.close()
    assert list(tmp_path.glob("events.out.tfevents.*"))

    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    expected = {"charts/episodic_return", "charts/episodic_length", "charts/learning_rate",
                "charts/SPS", *(f"losses/{c}" for c in LOSS_COLUMNS),
                *(f"perf/t_{p}_s" for p in schema.PHASES)}
    assert set(ea.Tags()["scalars"]) == expected

    def points(tag):
        return [(e.step, e.value) for e in ea.Scalars(tag)]

    assert points("charts/episodic_return") == [(1024, 10.0), (1024, 30.0), (3072, 5.0)]
    assert points("charts/episodic_length") == [(1024, 100.0), (1024, 300.0), (3072, 50.0)]
    assert points("charts/SPS") == [(1024, 1.25), (2048, 2.25), (3072, 3.25)]
    assert points("losses/approx_kl") == points("perf/t_env_s") == points("charts/SPS")

    text = ea.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text.startswith("|param|value|\n|-|-|\n")
    for line in ("|exp_name|t|", "|ppo.gamma|0.99|", "|env.num_envs|8|"):
        assert line in text.splitlines()


def _read_events(folder) -> tuple[dict, str]:
    """({tag: [(step, value)]}, hyperparameters text) with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder))
    ea.Reload()
    scalars = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    text = ea.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    return scalars, text


def test_tensorboardx_writes_what_torch_writer_wrote(tmp_path):
    """The switch to tensorboardX changes no tag, step, value or text: the same rows through
    torch.utils.tensorboard (the writer before) and through TensorBoardWriter read back equal."""
    from torch.utils.tensorboard import SummaryWriter

    config = {"exp_name": "t", "ppo": {"gamma": 0.99}}
    rows = [(make_row(1), [(10.0, 100)]), (make_row(2), None), (make_row(3), [(5.0, 50)])]
    ours = TensorBoardWriter(tmp_path / "ours")
    ours.add_hparams_text(config)
    for row, episodes in rows:
        ours.write(row, episodes)
    ours.close()
    before = SummaryWriter(str(tmp_path / "torch"))
    before.add_text("hyperparameters", "|param|value|\n|-|-|\n|exp_name|t|\n|ppo.gamma|0.99|")
    for row, episodes in rows:
        step = row["global_step"]
        for ret, length in episodes or ():
            before.add_scalar("charts/episodic_return", ret, step)
            before.add_scalar("charts/episodic_length", length, step)
        for tag, column in tensorboard.TB_SCALARS.items():
            before.add_scalar(tag, row[column], step)
    before.close()
    assert _read_events(tmp_path / "ours") == _read_events(tmp_path / "torch")


# --- EpisodeTracker -------------------------------------------------------------------------


def test_episode_tracker_last100_and_iteration_columns():
    tracker = EpisodeTracker()
    assert math.isnan(tracker.last100_mean())
    empty = tracker.add([], [])
    assert empty["episodes"] == 0 and math.isnan(empty["episodic_return_mean"])
    assert math.isnan(empty["episodic_length_mean"])
    assert math.isnan(empty["episodic_return_last100"])
    tracker.add(list(range(100)), [1] * 100)
    cols = tracker.add([1000.0] * 50, [400] * 50)
    assert cols == {"episodic_return_mean": 1000.0, "episodic_length_mean": 400.0,
                    "episodes": 50, "episodic_return_last100": (sum(range(50, 100)) + 50_000) / 100}
    resumed = EpisodeTracker()
    resumed.load_state_dict(tracker.state_dict())
    assert resumed.last100_mean() == tracker.last100_mean()
    with pytest.raises(ValueError):
        tracker.add([1.0], [])


def test_reference_returns_hand_computed():
    """CleanRL's EnvPool statistics on a hand-made history of 2 envs."""
    ref = ReferenceReturns(num_envs=2)
    # iteration 1: no game yet. ppo_atari_envpool: nothing logged; xla: both envs at 0
    cols = ref.add([], envpool_logged=[])
    assert math.isnan(cols["envpool_avg_return_last100"]) and cols["xla_avg_return_last100"] == 0
    # iteration 2: env 1 finishes 10 then 30 (the later is its latest); the script logged both:
    # its 20-game means are 10, then 20
    cols = ref.add([(1, 10.0), (1, 30.0)], envpool_logged=[10.0, 30.0])
    assert cols["xla_avg_return_last100"] == (0 + (0 + 30) / 2) / 2          # 7.5
    assert cols["envpool_avg_return_last100"] == (10 + 20) / 2               # 15
    # 130 more iterations, each with one game of 100 on env 0, logged: both windows fill
    for _ in range(130):
        cols = ref.add([(0, 100.0)], envpool_logged=[100.0])
    logged = [10.0, 30.0] + [100.0] * 130
    avg20 = [sum(logged[max(0, i - 19):i + 1]) / len(logged[max(0, i - 19):i + 1])
             for i in range(len(logged))]
    assert cols["envpool_avg_return_last100"] == pytest.approx(sum(avg20[-100:]) / 100)
    xla = [0.0, 7.5] + [(100 + 30) / 2] * 130
    assert cols["xla_avg_return_last100"] == pytest.approx(sum(xla[-100:]) / 100) == 65.0
    # a backend without the script's bookkeeping: no envpool statistic
    assert math.isnan(ReferenceReturns(2).add([(0, 5.0)], None)["envpool_avg_return_last100"])
    resumed = ReferenceReturns(2)
    resumed.load_state_dict(ref.state_dict())
    assert resumed.add([(1, 7.0)], [7.0]) == ref.add([(1, 7.0)], [7.0])


# --- Progress -------------------------------------------------------------------------------

def test_progress_plain_lines_when_not_a_tty():
    out = io.StringIO()
    progress = Progress(10_000, stream=out)
    progress.update(1_000, sps=100.0, recent_return=None)
    progress.update(5_000, sps=1_234.0, recent_return=12.345)
    progress.update(5_000, sps=0.0, recent_return=math.nan)
    progress.close()
    lines = out.getvalue().split("\n")
    assert "\r" not in out.getvalue() and lines[-1] == "" and len(lines) == 4
    assert lines[0] == "step 1,000/10,000 ( 10.0%) | SPS 100 | return - | ETA 0:01:30"
    assert lines[1] == "step 5,000/10,000 ( 50.0%) | SPS 1,234 | return 12.35 | ETA 0:00:04"
    assert lines[2].endswith("return - | ETA -")


def test_progress_rewrites_one_line_on_a_tty():
    out = io.StringIO()
    progress = Progress(100, stream=out, tty=True)
    progress.update(50, sps=1_000_000.0, recent_return=1.0)
    progress.update(100, sps=10.0, recent_return=None)
    assert "\n" not in out.getvalue()
    first, second = out.getvalue().split("\r")[1:]
    assert len(second) >= len(first)  # a shorter line blanks out the longer one's tail
    progress.close()
    assert out.getvalue().endswith("\n")
    assert format_eta(3725) == "1:02:05" and format_eta(math.inf) == "-"


# --- docs and imports -----------------------------------------------------------------------

def test_docs_table_is_the_generated_schema():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    begin = doc.index("\n", doc.index("<!-- schema:begin")) + 1
    assert doc[begin:doc.index("<!-- schema:end -->")] == schema_markdown()
    for tag in tensorboard.TB_SCALARS:
        assert f"`{tag}`" in doc, tag


def test_a_file_written_before_later_columns_reads_back_and_resumes(tmp_path):
    """A run from before learner_threads/runner_threads/learner_recoveries existed: its rows
    read back with 0 there (not recorded), and a sink resumes on it writing full rows."""
    import pyarrow as pa
    old = [c for c in schema.COLUMNS if c.name not in schema.ADDED_LATER]
    rows = [{k: v for k, v in make_row(i).items() if k not in schema.ADDED_LATER}
            for i in (1, 2)]
    path = tmp_path / "metrics.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.arrow_schema(old)), path)
    with pytest.raises(ValueError, match="missing column"):  # only those columns are filled
        schema.validate_row({k: v for k, v in rows[0].items() if k != "policy_lag"})
    df = parquet.read_metrics(path).to_pandas()
    assert df["iteration"].tolist() == [1, 2]
    assert df[list(schema.ADDED_LATER)].to_numpy().tolist() == [[0, 0, 0], [0, 0, 0]]
    sink = ParquetSink(str(path))
    sink.write(make_row(3, learner_recoveries=1), flush=True)
    sink.close()
    df = parquet.read_metrics(path).to_pandas()
    assert df["iteration"].tolist() == [1, 2, 3]
    assert df["learner_recoveries"].tolist() == [0, 0, 1]


def test_read_rows_through_a_file_system_by_columns_and_leniently(tmp_path):
    """How `distppo status` reads a run copy on any pyarrow file system: a few columns, and a
    damaged tail line (a copy being replaced under it) skipped instead of raised."""
    import pyarrow.fs as pafs
    path = tmp_path / "copy" / METRICS
    sink = ParquetSink(path)
    for i in range(1, 4):
        sink.write(make_row(i), flush=i == 2)  # rows 1-2 in metrics.parquet, row 3 in its tail
    full = parquet.read_rows(path)
    assert [r["iteration"] for r in full] == [1, 2, 3]
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    some = parquet.read_rows(f"copy/{METRICS}", fs, ["global_step", "sps"])
    assert some == [{"run_id": r["run_id"], "iteration": r["iteration"],
                     "global_step": r["global_step"], "sps": r["sps"]} for r in full]
    with open(parquet.tail_path(path), "a") as f:
        f.write('{"iteration": "damaged"}\n')
    with pytest.raises(UserError, match="line 2 is damaged"):
        parquet.read_rows(path)
    assert [r["iteration"] for r in parquet.read_rows(path, lenient=True)] == [1, 2, 3]
    path.write_bytes(b"not parquet")
    with pytest.raises(UserError, match="cannot be read"):
        parquet.read_rows(path)
    assert [r["iteration"] for r in parquet.read_rows(path, lenient=True)] == [3]
    assert parquet.read_rows(tmp_path / "none" / METRICS) == []
