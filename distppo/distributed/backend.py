"""RayBackend: LocalBackend's Samplers and PPOLearner(s), each inside a Ray actor.

- Env runners are spread over nodes (SPREAD) and restarted by Ray when their process dies;
  the rollout of a restarted runner is re-requested with the same weights object.
- M learners train data-parallel: the batch is split by env, gradients are averaged every
  minibatch (GradAllReduce); a dead learner makes every learner be recreated and restored
  from the last checkpoint by the loop (LearnerFailure).
"""
from __future__ import annotations

import os
import time

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from .config import TrainConfig
from .learner import RemoteLearner
from .rollout import RolloutMeta
from .runinfo import UserError
from .runners import RemoteEnvRunner
from .trainer import LearnerFailure, RunnerFailure

CALL_TIMEOUT_S = 900.0  # no rollout or update of a sane config takes this long: fail loudly
RESTART_TIMEOUT_S = 120.0  # a restarted runner that is not back by then is not coming back


def required_resources(cfg: TrainConfig) -> dict:
    r, lr = cfg.runner, cfg.learner
    return {"CPU": r.num_env_runners * r.runner_cpus + lr.num_learners * lr.learner_cpus,
            "GPU": lr.num_learners * lr.learner_gpus}


def ensure_ray(cfg: TrainConfig) -> None:
    """Join RAY_ADDRESS when set, else start a local single-node Ray sized for this run."""
    need = required_resources(cfg)
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=max(os.cpu_count() or 1, int(need["CPU"] + 0.999)),
                     include_dashboard=False, log_to_driver=False)
    have = ray.cluster_resources()
    for key, amount in need.items():
        if amount > have.get(key, 0.0) + 1e-9:
            raise UserError(f"this run needs {amount:g} {key} but the Ray cluster has "
                            f"{have.get(key, 0.0):g}: lower --num-env-runners/--runner-cpus/"
                            f"--num-learners/--learner-gpus or add nodes")


def runner_strategy():
    """SPREAD over the cluster, except inside a placement group (a sweep trial): an explicit
    strategy would take the runners out of the group the trial reserved for them."""
    from ray.util.placement_group import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    group = get_current_placement_group()
    return "SPREAD" if group is None else PlacementGroupSchedulingStrategy(group)


class RayBackend:
    def __init__(self, cfg: TrainConfig, video_dir: str | None = None):
        ensure_ray(cfg)
        self.cfg = cfg
        r = cfg.runner
        self.runners = [
            RemoteEnvRunner.options(num_cpus=r.runner_cpus, scheduling_strategy=runner_strategy(),
                                    max_restarts=r.runner_max_restarts, max_task_retries=0
                                    ).remote(cfg, i, video_dir)
            for i in range(r.num_env_runners)
        ]
        self.obs_shape, self.num_actions = self._get(self.runners[0].env_spec.remote(), "runner 0")
        self.learners = self._make_learners()
        self.num_env_runners = r.num_env_runners
        self.num_learners = cfg.learner.num_learners
        self.runner_restarts = 0
        self.timings = {"t_transfer_s": 0.0, "t_wait_s": 0.0}
        self._weights = None
        # Wait until every actor is up: like CleanRL's SPS timer, ours starts after construction.
        runner_nodes = ray.get([a.node_id.remote() for a in self.runners], timeout=CALL_TIMEOUT_S)
        device = ray.get(self.learners[0].device.remote(), timeout=CALL_TIMEOUT_S)
        print(f"ray: {len(self.runners)} env runners on {len(set(runner_nodes))} node(s), "
              f"{len(self.learners)} learner(s) on {device}", flush=True)

    def _get(self, ref, who: str):
        try:
            return ray.get(ref, timeout=CALL_TIMEOUT_S)
        except RayTaskError as exc:
            raise RunnerFailure(str(exc.cause)) from None
        except RayActorError as exc:  # its constructor raised: name the cause, not Ray's dump
            lines = [line for line in str(exc).splitlines() if "EnvError:" in line]
            raise RunnerFailure(lines[-1].split("EnvError: ", 1)[1] if lines else f"{who} died") from None
        except GetTimeoutError:
            raise RunnerFailure(f"{who} did not answer within {CALL_TIMEOUT_S:.0f} s") from None

    def _make_learners(self) -> list:
        lr, m = self.cfg.learner, self.cfg.learner.num_learners
        learners = [RemoteLearner.options(num_cpus=lr.learner_cpus, num_gpus=lr.learner_gpus,
                                          max_restarts=0).remote(self.cfg, self.obs_shape,
                                                                 self.num_actions, rank)
                    for rank in range(m)]
        if m > 1:
            addr, port = ray.get(learners[0].rendezvous_address.remote(), timeout=CALL_TIMEOUT_S)
            ray.get([l.init_group.remote(addr, port, rank, m) for rank, l in enumerate(learners)],
                    timeout=CALL_TIMEOUT_S)
        ray.get([l.pid.remote() for l in learners], timeout=CALL_TIMEOUT_S)
        return learners

    # -- sampling ---------------------------------------------------------------------------
    def broadcast_weights(self, version: int) -> None:
        # The learner's return value is put into the object store once; every runner reads it.
        self._weights = self.learners[0].get_weights.remote()

    def start_sample(self, version: int):
        start = time.perf_counter()
        refs = [self._submit(i, self._weights, version) for i in range(len(self.runners))]
        return start, refs, self._weights, version

    def _submit(self, i: int, weights, version: int):
        return self.runners[i].sample.options(num_returns=2).remote(weights, version)

    def finish_sample(self, handle) -> tuple[list[RolloutMeta], list]:
        start, refs, weights, version = handle
        pairs = [self._collect(i, pair, weights, version) for i, pair in enumerate(refs)]
        metas = [meta for meta, _ in pairs]
        busy = max(m.t_env_s + m.t_infer_s for m in metas)
        self.timings["t_wait_s"] = max(time.perf_counter() - start - busy, 0.0)
        return metas, [(ref, meta.num_envs) for meta, ref in pairs]

    def _collect(self, i: int, pair, weights, version: int):
        """Runner i's (meta, batch ref); if its process died, Ray restarts it and we ask again."""
        for _ in range(self.cfg.runner.runner_max_restarts + 1):
            meta_ref, batch_ref = pair
            try:
                return ray.get(meta_ref, timeout=CALL_TIMEOUT_S), batch_ref
            except RayTaskError as exc:  # the env itself raised: no retry can help
                raise RunnerFailure(str(exc.cause)) from None
            except RayActorError:
                self.runner_restarts += 1
                self._wait_until_alive(i)
                pair = self._submit(i, weights, version)
            except GetTimeoutError:
                raise RunnerFailure(f"env runner {i} did not answer within {CALL_TIMEOUT_S:.0f} s") from None
        raise RunnerFailure(f"env runner {i} ({self.cfg.env.env_id}) died more than "
                            f"{self.cfg.runner.runner_max_restarts} times: see its log in the Ray session folder")

    def _wait_until_alive(self, i: int) -> None:
        """Ray is restarting runner i (its constructor builds fresh envs); wait for it."""
        deadline = time.time() + RESTART_TIMEOUT_S
        while time.time() < deadline:
            try:
                ray.get(self.runners[i].pid.remote(), timeout=RESTART_TIMEOUT_S)
                return
            except RayActorError:
                time.sleep(0.5)
            except GetTimeoutError:
                break
        raise RunnerFailure(f"env runner {i} ({self.cfg.env.env_id}) did not come back within "
                            f"{RESTART_TIMEOUT_S:.0f} s after its process died")

    # -- learning ---------------------------------------------------------------------------
    def learn(self, runner_batches: list, iteration: int) -> dict:
        """runner_batches: [(batch ref, num_envs)] in runner order; learner k trains on envs
        [k*S, (k+1)*S) of their concatenation, S = num_envs / num_learners."""
        start = time.perf_counter()
        share = sum(n for _, n in runner_batches) // len(self.learners)
        refs = [l.update.remote(env_shares(runner_batches, k * share, (k + 1) * share), iteration)
                for k, l in enumerate(self.learners)]
        try:
            stats = ray.get(refs, timeout=CALL_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as exc:
            raise LearnerFailure(f"a learner failed: {type(exc).__name__}") from None
        # what the learners did not spend updating went to moving the batch and scheduling
        self.timings["t_transfer_s"] = max(time.perf_counter() - start - max(s["t_update_s"] for s in stats), 0.0)
        return stats[0]  # rank 0's losses, as ppo_atari_multigpu.py logs rank 0

    def learner_state(self) -> dict:
        try:
            return ray.get(self.learners[0].state_dict.remote(), timeout=CALL_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as exc:
            raise LearnerFailure(f"learner 0 failed: {type(exc).__name__}") from None

    def load_learner_state(self, state: dict) -> None:
        ray.get([l.load_state_dict.remote(state) for l in self.learners], timeout=CALL_TIMEOUT_S)

    def recover_learners(self, state: dict) -> None:
        """Replace every learner (a broken process group cannot be repaired) and restore them."""
        for learner in self.learners:
            ray.kill(learner)
        self.learners = self._make_learners()
        self.load_learner_state(state)

    def learner_weights(self) -> list[dict]:
        return ray.get([l.get_weights.remote() for l in self.learners], timeout=CALL_TIMEOUT_S)

    def close(self) -> None:
        for actor in self.runners + self.learners:
            ray.kill(actor)


def env_shares(runner_batches: list, lo: int, hi: int) -> list:
    """The [(ref, first, end)] pieces of the runners' batches that cover global envs [lo, hi)."""
    pieces, offset = [], 0
    for ref, n in runner_batches:
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            pieces.append((ref, a - offset, b - offset))
        offset += n
    return pieces
