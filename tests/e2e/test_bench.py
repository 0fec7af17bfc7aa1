"""`distppo bench` end to end on a tiny config (a functional test: no speed is asserted)."""
import json

from helpers import run_cli


def test_bench_table(tmp_path):
    out = tmp_path / "table.md"
    proc = run_cli("bench", "--env-id", "CartPole-v1", "--backend", "gym", "--algo", "ppo",
                   "--total-timesteps", "256", "--repeats", "1", "--extra",
                   "--num-envs 2 --num-steps 64 --num-minibatches 2",
                   "--variant", "local=--local", "--variant", "local2=--local --num-env-runners 2",
                   "--out", out, "--json", tmp_path / "bench.json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ppo |")]
    assert [r.split("|")[2].strip() for r in rows] == ["local", "local2"]
    assert rows[0].split("|")[5].strip() == "1.00"  # ratios are relative to the first variant
    assert float(rows[1].split("|")[3].replace(",", "")) > 0
    # --json: every run's numbers, what `distppo plan --from-bench` reads
    data = json.loads((tmp_path / "bench.json").read_text())
    assert (data["env_id"], data["backend"], data["total_timesteps"]) == ("CartPole-v1", "gym", 256)
    assert [(r["algo"], r["variant"]) for r in data["runs"]] == [("ppo", "local"),
                                                                  ("ppo", "local2")]
    assert all(r["sps"] > 0 and r["wall_s"] > 256 / r["sps"] for r in data["runs"])
    plan = run_cli("plan", "--games", "CartPole-v1", "--backend", "gym", "--seeds", "1",
                   "--nodes", "1", "--cpus-per-node", "4", "--from-bench",
                   tmp_path / "bench.json", "--json", timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["measured"]


def test_bench_bad_variant():
    proc = run_cli("bench", "--variant", "nonsense", timeout=60)
    assert proc.returncode == 2 and "NAME=FLAGS" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_sink_rows(tmp_path):
    """The metrics-writing benchmark: both writers write every row, the new one rewrites
    metrics.parquet only at checkpoints (twice each: before and after the checkpoint)."""
    out = tmp_path / "sink.md"
    proc = run_cli("bench", "--sink-rows", "300", "--checkpoint-every", "50", "--out", out,
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()[2:]]
    assert [r[0].split(" (")[0].strip() for r in rows] == [
        "tail rows, flush at checkpoints", "whole-file rewrite per row"]
    assert [r[1].strip() for r in rows] == ["300", "300"]
    assert [r[6].strip() for r in rows] == ["12", "300"]
    assert all(float(r[2]) > 0 for r in rows)


def test_env_only_bench_compares_backends(tmp_path):
    out = tmp_path / "envs.md"
    proc = run_cli("bench", "--env-only", "--env-id", "Breakout-v5", "--backend", "envpool",
                   "ale", "gym", "--num-envs", "2", "--total-timesteps", "64", "--repeats", "1",
                   "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|") for line in out.read_text().splitlines()[2:]]
    assert [r[1].strip() for r in rows] == ["envpool", "ale", "gym"]
    assert rows[0][5].strip() == "1.00" and all(float(r[3].replace(",", "")) > 0 for r in rows)
    two = run_cli("bench", "--backend", "envpool", "ale", timeout=60)
    assert two.returncode == 2 and "--env-only" in two.stderr and "Traceback" not in two.stderr
