"""--backend auto: the id's form picks the CleanRL experiment (NoFrameskip-v4: ppo_atari.py on
gym, -v5: ppo_atari_envpool.py on envpool), resolved once when a config is built; an explicit
backend and the backend a stored run or sweep recorded win."""
import json
import pickle
import subprocess
import sys

import pandas as pd
import pytest

from distppo.config import SweepConfig, TrainConfig
from distppo.envs.games import ATARI_57, auto_backend, to_gym
from distppo.errors import ConfigError
from distppo.report.references import reference_minutes
from distppo.sweep.plan import Cluster, format_plan, make_plan

from helpers import REPO, assert_one_line_error, run_cli


def test_auto_picks_the_experiment_the_id_names():
    for v5 in ATARI_57:
        assert (auto_backend(v5), auto_backend(to_gym(v5))) == ("envpool", "gym"), v5
    assert auto_backend("CartPole-v1") == "gym"
    with pytest.raises(ConfigError, match="did you mean Breakout-v5"):
        auto_backend("Breakuot-v5")


def test_defaults_stay_on_envpool_and_record_the_resolved_backend():
    cfg = TrainConfig()
    assert (cfg.env.env_id, cfg.env.backend, cfg.env.asked_backend) == (
        "Breakout-v5", "envpool", "auto")
    assert cfg.to_dict()["env"]["backend"] == "envpool"
    assert "CleanRL's ppo_atari_envpool.py" in cfg.experiment()


def test_auto_follows_a_new_env_id_and_an_explicit_backend_wins():
    cfg = TrainConfig()
    assert cfg.replace(env_id="BreakoutNoFrameskip-v4").env.backend == "gym"
    # another env field replaced first: the request stays auto
    assert cfg.replace(num_envs=4).replace(env_id="PongNoFrameskip-v4").env.backend == "gym"
    assert cfg.replace(env_id="CartPole-v1").env.backend == "gym"
    for backend in ("envpool", "ale"):
        pinned = cfg.replace(env_id="BreakoutNoFrameskip-v4", backend=backend)
        assert pinned.env.backend == backend
        assert pinned.replace(env_id="PongNoFrameskip-v4").env.backend == backend
    gym = cfg.replace(env_id="BreakoutNoFrameskip-v4")
    assert gym.to_dict()["env"]["backend"] == "gym"
    assert "CleanRL's ppo_atari.py" in gym.experiment()
    assert "--backend envpool runs CleanRL's ppo_atari_envpool.py" in gym.experiment()
    with pytest.raises(ConfigError, match="use auto or one of envpool, gym, ale"):
        cfg.replace(backend="atari")


def test_old_runs_keep_their_recorded_backend():
    """config.json of a run made when envpool was the default for every id."""
    old = TrainConfig().to_dict()
    old["env"].update(env_id="BreakoutNoFrameskip-v4", backend="envpool")
    stored = TrainConfig.from_dict(json.loads(json.dumps(old)))
    assert (stored.env.backend, stored.env.asked_backend) == ("envpool", "envpool")
    # --resume with the run's own env id given again, and a longer budget
    resumed, changed = stored.resumed({"env_id": "BreakoutNoFrameskip-v4",
                                       "total_timesteps": 20_000_000})
    assert resumed.env.backend == "envpool" and list(changed) == ["total_timesteps"]
    with pytest.raises(ConfigError, match="--backend gym differs from the run's envpool"):
        stored.resumed({"backend": "auto"})
    # a config pickled before `auto` existed has no record of the request: its backend is it
    pickled = pickle.loads(pickle.dumps(stored))
    del pickled.env.__dict__["_asked_backend"]
    assert pickled.env.asked_backend == "envpool"
    assert pickled.replace(env_id="PongNoFrameskip-v4").env.backend == "envpool"


def test_a_sweep_resolves_auto_per_game_and_stores_the_request():
    games = ("Breakout-v5", "PongNoFrameskip-v4", "CartPole-v1")
    sweep = SweepConfig(games=games, seeds=(1,))
    backends = [sweep.trial_config(g, "ppo", 1).env.backend for g in games]
    assert backends == ["envpool", "gym", "gym"] == [sweep.backend_of(g) for g in games]
    assert sweep.backends() == ("envpool", "gym")
    assert sweep.to_dict()["train"]["env"]["backend"] == "auto"
    again = SweepConfig.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert [again.trial_config(g, "ppo", 1).env.backend for g in games] == backends
    said = sweep.experiments()
    assert said.startswith("experiments (--backend auto: per game id): ") and (
        "ppo on gym, 1 game(s): CleanRL's ppo_atari.py" in said)
    # a sweep.json from before auto: its backend was explicit, for every game
    old = dict(sweep.to_dict(), games=["PongNoFrameskip-v4"])
    old["train"]["env"]["backend"] = "envpool"
    assert SweepConfig.from_dict(old).trial_config("PongNoFrameskip-v4", "ppo", 1).env.backend \
        == "envpool"
    pinned = SweepConfig(train=TrainConfig().replace(backend="ale"), games=games[:2], seeds=(1,))
    assert pinned.backends() == ("ale",)


def test_plan_takes_each_games_reference_script():
    cfg = SweepConfig(train=TrainConfig().replace(learner_gpus=1.0),
                      games=("Pong-v5", "PongNoFrameskip-v4"), seeds=(1,))
    plan = make_plan(cfg, Cluster(1, 1, 16), None, reference_minutes(cfg))
    # runtimes.csv: ppo_atari_envpool Pong 178.375, ppo_atari Pong 281.071 min per 10M steps
    assert plan["trial_minutes"] == pytest.approx([178.375, 281.071])
    assert format_plan(plan).splitlines()[0] == cfg.experiments()


def test_cli_help_and_first_line_name_the_experiment(tmp_path):
    help_text = " ".join(run_cli("train", "--help", timeout=60).stdout.split())
    assert "(default: Breakout-v5)" in help_text
    assert "config.json records the one picked) | envpool" in help_text
    assert ("sets torch.backends.cudnn.deterministic to this value in every process that runs "
            "torch") in help_text
    proc = run_cli("train", "--local", "--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2",
                   "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
                   "--total-timesteps", "32", "--output-dir", tmp_path, "--run-name", "r",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first == ("experiment: CleanRL's ppo_atari.py: BreakoutNoFrameskip-v4, ppo on gym "
                     "(gymnasium + ale-py with SB3's Atari wrappers); --backend auto chose gym "
                     "for this id, --backend envpool runs CleanRL's ppo_atari_envpool.py"), first
    record = json.loads((tmp_path / "r" / "config.json").read_text())
    assert record["config"]["env"]["backend"] == "gym"
    assert (pd.read_parquet(tmp_path / "r" / "metrics.parquet")["backend"] == "gym").all()


def test_missing_envpool_says_to_pass_backend_ale(tmp_path):
    """Where EnvPool cannot be installed, auto on a -v5 id still picks EnvPool's experiment and
    the error line names the way out."""
    code = ("import sys; sys.modules['envpool'] = None; from distppo.cli.main import main; "
            f"sys.exit(main(['train', '--local', '--env-id', 'Pong-v5', '--output-dir', "
            f"{str(tmp_path)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert_one_line_error(proc, "--backend auto picked envpool", "envpool package",
                          "pass --backend ale")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_sweep_runs_each_game_on_its_own_experiment(ray_cluster, tmp_path):
    """One -v5 and one NoFrameskip-v4 game in one sweep: envpool and gym trials, said first
    and recorded in each run's config.json and in trials.parquet."""
    proc = run_cli("sweep", "--games", "Breakout-v5", "BreakoutNoFrameskip-v4", "--seeds", "1",
                   "--local", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
                   "--update-epochs", "1", "--total-timesteps", "32", "--storage", tmp_path,
                   "--name", "mixed", timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == (
        "experiments (--backend auto: per game id): ppo on envpool, 1 game(s): CleanRL's "
        "ppo_atari_envpool.py; ppo on gym, 1 game(s): CleanRL's ppo_atari.py")
    sweep_dir = tmp_path / "mixed"
    assert json.loads((sweep_dir / "sweep.json").read_text())["train"]["env"]["backend"] == "auto"
    trials = pd.read_parquet(sweep_dir / "trials.parquet").set_index("env_id")
    assert trials["backend"].to_dict() == {"Breakout-v5": "envpool",
                                           "BreakoutNoFrameskip-v4": "gym"}
    for env_id, backend in trials["backend"].items():
        copy = sorted((sweep_dir / "runs" / f"{env_id}__ppo__1").iterdir())[-1]
        stored = json.loads((copy / "config.json").read_text())["config"]["env"]
        assert (stored["env_id"], stored["backend"]) == (env_id, backend)
