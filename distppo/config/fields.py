"""What each config field is for, declared beside it, so the lists that depend on it are read
from the fields instead of kept by hand.

    learning_rate: float = algorithm(2.5e-4)
    num_threads: int | Literal["auto"] = execution("auto", resume=True)

Roles:
- identity: which experiment a run is (game, algo, backend, seed, budget): the rows and
  sections of a report;
- algorithm: what is learned; a value other than CleanRL's default makes another experiment
  (`distppo report` lists such settings beside the references);
- execution: where and how fast it runs; the learning is the same (bit-equal, or within float
  rounding where the field's help says so);
- output: what is written and logged.

`resume`: `--resume` may change the field (config/train.py RESUME_SAFE); every other field
defines the learning problem or the run's identity, and a resumed run keeps its stored value.
`per_trial`: a sweep sets it for each trial (the grid point, the run folder), so it is not a
flag of `distppo sweep`.
"""
from __future__ import annotations

import dataclasses

ROLES = ("identity", "algorithm", "execution", "output")


def _setting(role: str):
    def make(default, *, resume: bool = False, per_trial: bool = False):
        return dataclasses.field(default=default, metadata={
            "role": role, "resume": resume, "per_trial": per_trial})
    make.__name__ = role
    make.__doc__ = f"A config field of role `{role}` (module doc)."
    return make


identity, algorithm, execution, output = (_setting(r) for r in ROLES)


def meta(f: dataclasses.Field) -> dict:
    """The declared metadata of a config field (a KeyError names an undeclared one)."""
    return {"role": f.metadata["role"], "resume": f.metadata["resume"],
            "per_trial": f.metadata["per_trial"]}
