"""EnvRunner: a thin Ray shell around Sampler (no algorithm logic lives here)."""
from __future__ import annotations

import os

import ray
import torch

# Ray's own GCS tables, read directly: the public ray.util.state asks the dashboard, which
# local runs do not start (connect.py). Private, hence pyproject's upper bound on Ray.
from ray._private.state import actors as actor_table
from ray._private.state import jobs as job_table

from distppo.config import TrainConfig
from distppo.core.rollout import RolloutBatch, RolloutMeta
from distppo.core.sampler import make_sampler
from distppo.core.threads import cores, reuse_freed_memory, within_cores
from distppo.distributed.boundary import Started, host_only
from distppo.errors import EnvError
from distppo.testing import faults


@host_only
class EnvRunner(Started):
    def __init__(self, cfg: TrainConfig, runner_index: int, video_dir: str | None = None,
                 threads: int = 1):
        # Ray sets OMP_NUM_THREADS from num_cpus (1 without); torch's own count is what
        # inference uses: resolve()'s (placement/resolve.py), within this machine's cores.
        torch.set_num_threads(within_cores(threads))
        self.malloc_reuse = reuse_freed_memory(cfg.runner.malloc_reuse)
        self.label = f"env runner {runner_index} ({cfg.env.env_id}, {cfg.env.backend})"
        # Ray runs this constructor again in a new process after the old one died; the
        # restart count picks fresh env seeds for the rebuilt envs (core/seeds.py).
        self.incarnation = num_restarts(ray.get_runtime_context().get_actor_id())
        self.failed: EnvError | None = None  # raised by started()
        try:
            self.sampler = make_sampler(cfg, runner_index, video_dir, self.incarnation)
        except Exception as exc:  # noqa: BLE001 - any error of the env libraries, named
            self.failed = EnvError(f"{self.label} could not create its envs: "
                                   f"{type(exc).__name__}: {exc}")
        faults.kill_once("runner_init")
        faults.pause("runner_init")

    def env_spec(self) -> tuple[tuple, int]:
        return self.sampler.env_spec()

    def sample(self, weights: dict, version: int) -> tuple[RolloutMeta, RolloutBatch]:
        """Load the iteration's weights (Ray resolved the one shared object) and collect.

        Called with num_returns=2: the small meta goes to the trainer, the batch's arrays
        stay in the object store until the learners fetch them.
        """
        self.sampler.set_weights(weights, version)
        try:
            batch = self.sampler.collect()
        except Exception as exc:
            raise EnvError(f"{self.label} failed while stepping: "
                           f"{type(exc).__name__}: {exc}") from None
        return batch.meta, batch

    def observed(self) -> tuple[str, int, bool]:
        """What only this process knows: (the device its policy acts on, the cores it may run
        on, whether freed memory is kept for reuse: --malloc-reuse applied)."""
        return str(self.sampler.device), cores(), self.malloc_reuse

    def pid(self) -> int:
        return os.getpid()

    def cudnn_deterministic(self) -> bool:
        """This process's flag, which --torch-deterministic sets (core/seeds.py)."""
        return torch.backends.cudnn.deterministic

    def seed(self) -> tuple[int, int]:
        """(incarnation, seed of its first env): which envs this process built."""
        return self.incarnation, self.sampler.seed

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def placement_group_id(self) -> str | None:
        return ray.get_runtime_context().get_placement_group_id()


def num_restarts(actor_id: str) -> int:
    """How often Ray restarted the actor, from the GCS actor table: the record Ray itself reads
    for `RuntimeContext.was_current_actor_reconstructed`. It counts every restart, also one
    between two calls that no caller ever sees fail."""
    info = actor_table(actor_id=actor_id)
    return int(info.get("NumRestarts", 0)) if info else 0


def job_ended() -> bool:
    """Whether Ray has marked this job finished (its driver died). Ray then kills the job's
    workers, and a runner whose owner has not died yet shows in the actor table as restarted:
    part of the teardown, not a fault of the run. A GCS that does not answer: False."""
    job_id = ray.get_runtime_context().get_job_id()
    try:
        return any(job["JobID"] == job_id and job["IsDead"] for job in job_table())
    except Exception:  # noqa: BLE001 - any GCS client error
        return False


RemoteEnvRunner = ray.remote(EnvRunner)
