"""`distppo bench` end to end on a tiny config (a functional test: no speed is asserted)."""
from conftest import run_cli


def test_bench_table(tmp_path):
    out = tmp_path / "table.md"
    proc = run_cli("bench", "--env-id", "CartPole-v1", "--backend", "gym", "--algo", "ppo",
                   "--total-timesteps", "256", "--repeats", "1", "--extra",
                   "--num-envs 2 --num-steps 64 --num-minibatches 2",
                   "--variant", "local=--local", "--variant", "local2=--local --num-env-runners 2",
                   "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ppo |")]
    assert [r.split("|")[2].strip() for r in rows] == ["local", "local2"]
    assert rows[0].split("|")[5].strip() == "1.00"  # ratios are relative to the first variant
    assert float(rows[1].split("|")[3].replace(",", "")) > 0


def test_bench_bad_variant():
    proc = run_cli("bench", "--variant", "nonsense", timeout=60)
    assert proc.returncode == 2 and "NAME=FLAGS" in proc.stderr and "Traceback" not in proc.stderr
