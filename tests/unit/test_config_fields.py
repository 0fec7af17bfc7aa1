"""Each config field declares its role and whether --resume may change it (config/fields.py);
the lists that depend on that are read from the fields, and behave as declared."""
import dataclasses

import pytest

from distppo.cli.sweep import GRID_FIELDS
from distppo.config import FLAT_FIELDS, RESUME_SAFE, SECTIONS, SweepConfig, TrainConfig
from distppo.config.fields import ROLES
from distppo.errors import ConfigError
from distppo.report.tables import EXPERIMENT_SETTINGS, changed_settings


def _fields():
    for cls in (*SECTIONS.values(), TrainConfig):
        for f in dataclasses.fields(cls):
            if f.name not in SECTIONS:
                yield f


def test_every_field_declares_its_role():
    names = []
    for f in _fields():
        assert f.metadata.get("role") in ROLES, f"{f.name}: declare it with config/fields.py"
        assert isinstance(f.metadata["resume"], bool) and isinstance(f.metadata["per_trial"], bool)
        names.append(f.name)
    assert sorted(names) == sorted(FLAT_FIELDS)


def test_auto_fields_are_typed_honestly():
    types = {f.name: f.type.replace("'", '"') for f in _fields()}
    for name in ("num_env_runners", "num_threads", "grad_shards"):
        assert types[name] == 'int | Literal["auto"]'
    for name in ("runner_gpus", "learner_gpus"):
        assert types[name] == 'float | Literal["auto"]'
    cfg = TrainConfig().replace(num_threads="2", num_env_runners="2", grad_shards="3",
                                learner_gpus="0.5", runner_gpus="0.25")
    assert (cfg.runner.num_threads, cfg.runner.num_env_runners, cfg.learner.grad_shards,
            cfg.learner.learner_gpus, cfg.runner.runner_gpus) == (2, 2, 3, 0.5, 0.25)


def test_resume_may_change_execution_and_output_never_what_is_learned():
    assert "total_timesteps" in RESUME_SAFE and "num_threads" in RESUME_SAFE
    assert not set(RESUME_SAFE) & set(EXPERIMENT_SETTINGS)
    stored = TrainConfig()
    new, changed = stored.resumed({"num_threads": "2", "log_every": 5})
    assert changed == {"num_threads": ["auto", 2], "log_every": [1, 5]}
    for name in EXPERIMENT_SETTINGS:
        value = getattr(getattr(stored, FLAT_FIELDS[name]), name)
        other = {bool: lambda v: not v, int: lambda v: v * 2, float: lambda v: v / 2,
                 type(None): lambda v: 0.05}[type(value)](value)
        with pytest.raises(ConfigError, match="--resume cannot change it"):
            stored.resumed({name: other})


def test_report_lists_algorithm_settings_only():
    train = TrainConfig().replace(ent_coef=0.02, num_threads="2", checkpoint_every=7)
    spec = SweepConfig(train=train, games=("Breakout-v5",), seeds=(1,))
    assert changed_settings(spec) == ["--ent-coef 0.02"]


def test_the_sweep_sets_per_trial_fields_itself():
    assert GRID_FIELDS == ("env_id", "algo", "seed", "output_dir", "run_name", "log_every")
