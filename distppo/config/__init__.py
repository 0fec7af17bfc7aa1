"""One typed, frozen configuration; every field has a docstring that becomes its `--help` line.

Defaults equal CleanRL's `ppo_atari.py` (see shared/reference/hyperparameters.md, section 1).
`validate()` runs at construction and raises ConfigError with a one-line fix.

- sections.py: the env, ppo, runner, learner and tracking sections
- fields.py: each field's role, and whether --resume may change it
- train.py: TrainConfig, the flat field names, field docstrings, what --resume may change
- sweep.py: SweepConfig and trial ids
"""
from distppo.config.sections import (
    ALGOS,
    AMP,
    DEVICES,
    MAX_SEED,
    RUNNER_DEVICES,
    EnvConfig,
    LearnerConfig,
    PPOConfig,
    RunnerConfig,
    TrackConfig,
)
from distppo.config.sweep import SweepConfig, trial_id
from distppo.config.train import (
    FLAT_FIELDS,
    RESUME_SAFE,
    SECTIONS,
    TrainConfig,
    field_docs,
    fields_where,
    resume_flags,
)

__all__ = ["ALGOS", "AMP", "DEVICES", "MAX_SEED", "RUNNER_DEVICES", "EnvConfig", "LearnerConfig",
           "PPOConfig", "RunnerConfig", "TrackConfig", "SweepConfig", "trial_id", "FLAT_FIELDS",
           "RESUME_SAFE", "SECTIONS", "TrainConfig", "field_docs", "fields_where",
           "resume_flags"]
