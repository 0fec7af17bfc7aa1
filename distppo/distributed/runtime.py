"""RayRuntime: LocalRuntime's Samplers and PPOLearner(s), each inside a Ray actor.

- Env runners are spread over nodes (SPREAD) and restarted by Ray when their process dies;
  the rollout of a restarted runner is re-requested with the same weights object. Restarts
  are counted from Ray's actor table, so a runner that died between two calls (and whose
  next call simply waited for its new process) counts too.
- M learners train data-parallel: the batch is split by env, gradients are averaged every
  minibatch (GradAllReduce); a dead learner makes every learner be recreated and restored
  from the last checkpoint by the loop (LearnerFailure).
- --act-in learner: no runner actors; learner k steps runner k's envs in its own process and
  acts with its own parameters (distributed/learner.py), so no weights and no batch cross a
  process boundary; its envs go with it when it dies, and its replacement builds new ones.
"""
from __future__ import annotations

import time
from typing import Optional

import ray
import torch
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError

from distppo.config import TrainConfig
from distppo.core.rollout import RolloutMeta
from distppo.core.runtime import Observed
from distppo.distributed.connect import answer_within, connect
from distppo.distributed.learner import RemoteLearner
from distppo.distributed.resources import (
    check_cluster_has,
    cluster_facts,
    group_strategy,
    runner_strategy,
)
from distppo.distributed.runners import RemoteEnvRunner, job_ended, num_restarts
from distppo.errors import (
    EnvError,
    JobEnded,
    LearnerFailure,
    RunnerFailure,
    UserError,
    end_now,
)
from distppo.placement.resolve import Placement, resolve
from distppo.placement.sizing import (
    learner_bundle,
    learner_cpus,
    required_resources,
    runner_bundle,
    runner_gpus,
)
from distppo.telemetry.faultlog import OnFault, ignore_fault
from distppo.telemetry.stats import PhaseTimer
from distppo.testing import faults

CALL_TIMEOUT_S = 900.0  # no rollout or update of a sane config takes this long: fail loudly
RESTART_TIMEOUT_S = 120.0  # a restarted runner that is not back by then is not coming back
LEARNER_START_TRIES = 5  # learner processes killed while starting, in a row, before giving up
CLOSE_QUERY_S = 3.0  # the actor table answers in milliseconds while Ray is up
POLL_S = 1.0  # while waiting on any call, look at the actor table for runner restarts this often


class RayRuntime:
    def __init__(self, cfg: TrainConfig, video_dir: str | None = None,
                 on_fault: OnFault | None = None):
        connect(min_cpus=required_resources(cfg)["CPU"])
        # every auto a number, from what the cluster declares; the actors are given them
        self.placement: Placement = resolve(cfg, cluster_facts())
        cfg = self.cfg = self.placement.config
        check_cluster_has(required_resources(cfg))
        torch.set_num_threads(self.placement.main_threads)
        self.video_dir = video_dir
        r = cfg.runner
        acting = r.act_in == "learner"  # the learners step the envs: no runner actors
        self.runners = [] if acting else [
            RemoteEnvRunner.options(num_cpus=r.runner_cpus,
                                    num_gpus=runner_gpus(cfg, 0.0),  # resolved: the number
                                    scheduling_strategy=runner_strategy(runner_bundle(cfg, i)),
                                    max_restarts=r.runner_max_restarts, max_task_retries=0
                                    ).remote(cfg, i, video_dir, self.placement.runner_threads)
            for i in range(r.num_env_runners)
        ]
        self.on_fault = on_fault or ignore_fault  # told of each fault as it is counted
        self.runner_restarts = 0  # env-runner restarts since this runtime started
        # the handle knows its actor's id before the actor answers: restarts of a runner killed
        # while it starts are counted while we wait
        self.runner_ids = [runner._actor_id.hex() for runner in self.runners]
        self._ask_runners("started")  # every runner built its envs, or one line says why not
        self.obs_shape, self.num_actions = (None, None) if acting else \
            self._ask_runners("env_spec", only=0)[0]
        self.learner_starts = 0  # learner sets started so far: their envs' incarnation
        self.learners = self._make_learners()
        self.timer = PhaseTimer()
        self.in_flight: list = []  # the metas of the rollout the runners are sampling
        # Wait until every actor is up: like CleanRL's SPS timer, ours starts after construction.
        self._seen = self._observe()
        self._note_restarts()  # runners killed while starting

    def _observe(self) -> Observed:
        device, gpu_name, learner_cores, learner_reuse = self._learner_observed
        if self.runners:
            runner_nodes = self._ask_runners("node_id")
            runner_device, runner_cores, runner_reuse = self._ask_runners("observed", only=0)[0]
        else:  # the learners act, on their own device and cores
            runner_nodes = self._get([learner.node_id.remote() for learner in self.learners])
            runner_device, runner_cores, runner_reuse = device, learner_cores, learner_reuse
        group = ray.get_runtime_context().get_placement_group_id()
        theirs = self._ask_runners("placement_group_id") + self._learner_groups
        return Observed("ray", device, gpu_name, runner_device, len(set(runner_nodes)),
                        in_placement_group=group is not None and all(t == group for t in theirs),
                        learner_cores=learner_cores, runner_cores=runner_cores,
                        reuses_freed_memory=learner_reuse and runner_reuse)

    def observe(self) -> Observed:
        return self._seen

    def _ask_runners(self, method: str, only: int | None = None) -> list:
        """Every runner's (or runner `only`'s) answer to a quick call while the runtime starts.
        A runner whose process is killed meanwhile is restarted by Ray: wait for it and ask
        again (counted from the actor table like any restart). A runner whose constructor
        could not build its envs (started()) is one RunnerFailure naming the cause."""
        indices = range(len(self.runners)) if only is None else [only]
        refs = {i: getattr(self.runners[i], method).remote() for i in indices}
        answers = []
        for i in indices:
            for _ in range(self.cfg.runner.runner_max_restarts + 1):
                try:
                    answers.append(self._get(refs[i]))
                    break
                except EnvError as exc:  # started(): the envs it could not build, named
                    raise RunnerFailure(str(getattr(exc, "cause", exc))) from None
                except RayActorError as exc:
                    if exc.actor_init_failed:  # a constructor that raised something else
                        raise RunnerFailure(f"env runner {i} could not start: see its log in "
                                            "the Ray session folder") from None
                    self._note_restarts()  # now: Ray counts a restart as it begins one
                    self._wait_until_alive(i)
                    refs[i] = getattr(self.runners[i], method).remote()
                except GetTimeoutError:
                    raise RunnerFailure(f"env runner {i} did not answer within "
                                        f"{CALL_TIMEOUT_S:.0f} s") from None
            else:
                raise self._died_too_often(i)
        return answers

    def _make_learners(self) -> list:
        """Start the learners (and their process group). A learner process killed while they
        start makes all of them start again (a learner recovery for on_fault); a constructor that
        raised is one line, a user error as the user's."""
        for _ in range(LEARNER_START_TRIES):
            learners = self._start_learners()
            try:
                self._get([learner.started.remote() for learner in learners])
                self._group(learners)
                # what observe() says of them, asked here: a kill now is a start death too
                self._learner_observed = self._get(learners[0].observed.remote())
                self._learner_groups = self._get([a.placement_group_id.remote()
                                                  for a in learners])
                return learners
            except (UserError, EnvError) as exc:  # started(): what its constructor found
                self._kill_all(learners)
                cause = getattr(exc, "cause", exc)  # Ray's error is also an instance of it
                if isinstance(cause, EnvError):  # --act-in learner: its envs
                    raise RunnerFailure(str(cause)) from None
                raise UserError(str(cause)) from None
            except RayActorError as exc:
                if not exc.actor_init_failed:  # its process died: start them again
                    for learner in learners:
                        ray.kill(learner)
                    check_job_alive("a learner process died while starting")
                    self.on_fault("learner_recoveries", 1,
                                  "a learner process died while starting; started again")
                    continue
                self._kill_all(learners)  # a constructor that raised something else
                raise LearnerFailure("a learner could not start: see its log in the Ray "
                                     "session folder") from None
        raise LearnerFailure(f"learner processes died {LEARNER_START_TRIES} times in a row "
                             "while starting: see their logs in the Ray session folder")

    def _kill_all(self, learners: list) -> None:
        for actor in learners + self.runners:
            ray.kill(actor)

    def _start_learners(self) -> list:
        lcfg = self.cfg.learner
        incarnation, self.learner_starts = self.learner_starts, self.learner_starts + 1
        return [RemoteLearner.options(num_cpus=learner_cpus(self.cfg),
                                      num_gpus=lcfg.learner_gpus,
                                      scheduling_strategy=group_strategy(learner_bundle(rank)),
                                      max_restarts=0).remote(self.cfg, self.obs_shape,
                                                             self.num_actions, rank,
                                                             self.placement.learner,
                                                             self.video_dir, incarnation)
                for rank in range(lcfg.num_learners)]

    def _group(self, learners: list) -> None:
        """Data-parallel learners join one process group (rank 0 listens)."""
        m = len(learners)
        if m > 1:
            addr, port = ray.get(learners[0].rendezvous_address.remote(), timeout=CALL_TIMEOUT_S)
            ray.get([learner.init_group.remote(addr, port, rank, m)
                     for rank, learner in enumerate(learners)], timeout=CALL_TIMEOUT_S)

    # -- sampling ---------------------------------------------------------------------------
    def start_rollout(self, version: int):
        """Every runner samples with learner 0's current weights, tagged `version`."""
        start = time.perf_counter()
        if not self.runners:  # the learners act with their own weights: nothing to send
            self.in_flight = [learner.sample.remote(version) for learner in self.learners]
            return start, self.in_flight, None, version
        # The learner's return value is put into the object store once; every runner reads it.
        weights = self.learners[0].get_weights.remote()
        refs = [self._submit(i, weights, version) for i in range(len(self.runners))]
        self.in_flight = [meta for meta, _ in refs]  # what an --overlap handover waits for
        return start, refs, weights, version

    def _submit(self, i: int, weights, version: int):
        return self.runners[i].sample.options(num_returns=2).remote(weights, version)

    def finish_rollout(self, handle) -> tuple[list[RolloutMeta], list | None]:
        """The rollout's metas and what learn() takes: the runners' batch refs, or None where
        each learner keeps the batch it sampled (--act-in learner)."""
        start, refs, weights, version = handle
        self.in_flight = []
        if self.runners:
            pairs = [self._collect(i, pair, weights, version) for i, pair in enumerate(refs)]
            metas, payload = [meta for meta, _ in pairs], [(ref, m.num_envs) for m, ref in pairs]
            self._note_restarts()
        else:
            metas, payload = self._learners_sampled(refs), None
        busy = max(m.t_env_s + m.t_infer_s for m in metas)
        self.timer.add("wait", max(time.perf_counter() - start - busy, 0.0))
        return metas, payload

    def _learners_sampled(self, refs: list) -> list[RolloutMeta]:
        """The metas of the rollouts the learners sampled: a learner that died is a learner
        failure (the loop recovers), envs that raised a runner failure, as a runner's."""
        try:
            return self._get(refs)
        except (RayActorError, ObjectLostError, GetTimeoutError) as exc:
            raise learner_failure(f"a learner failed while sampling: "
                                  f"{type(exc).__name__}") from None
        except RayTaskError as exc:
            raise RunnerFailure(str(exc.cause)) from None

    def _collect(self, i: int, pair, weights, version: int):
        """Runner i's (meta, batch ref); if its process died, Ray restarts it and we ask again."""
        for _ in range(self.cfg.runner.runner_max_restarts + 1):
            meta_ref, batch_ref = pair
            try:
                return self._get(meta_ref), batch_ref
            except RayTaskError as exc:
                if lost_input(exc):  # learner 0 died (its node removed) with the weights
                    raise learner_failure(f"env runner {i} lost its weights: "
                                          f"{type(exc.cause).__name__}") from None
                raise RunnerFailure(str(exc.cause)) from None  # the env raised: no retry helps
            except RayActorError:  # counted from the actor table, like any other restart
                self._note_restarts()  # now: Ray counts a restart as it begins one
                self._wait_until_alive(i)
                pair = self._submit(i, weights, version)
            except GetTimeoutError:
                raise RunnerFailure(f"env runner {i} did not answer within "
                                    f"{CALL_TIMEOUT_S:.0f} s") from None
        raise self._died_too_often(i)

    def _died_too_often(self, i: int) -> RunnerFailure:
        return RunnerFailure(f"env runner {i} ({self.cfg.env.env_id}) died more than "
                             f"{self.cfg.runner.runner_max_restarts} times: see its log in the "
                             "Ray session folder")

    def _get(self, refs, timeout: float = CALL_TIMEOUT_S):
        """ray.get(refs, timeout), reading the actor table every POLL_S meanwhile: a runner
        killed while this process waits on something else (a learner's update, another
        runner) is counted within about a second, not when a call next reaches it; a trial
        killed in between would otherwise never count it."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:  # ray.get itself each time: its errors (which failure of several) stay Ray's
                return ray.get(refs, timeout=max(min(POLL_S, left), 0))
            except GetTimeoutError:
                if left <= POLL_S:
                    raise
            self._note_restarts()

    def _note_restarts(self, within: Optional[float] = None) -> None:
        """Runner restarts since the last look go to on_fault, now. within: seconds the GCS
        may take to answer (None: as long as Ray waits)."""
        def look() -> tuple[int, bool]:  # (restarts so far, whether they are new faults)
            total = self._count_restarts()
            # a restart seen once the job has ended is its teardown, not a fault
            return total, total > self.runner_restarts and not job_ended()

        answer = look() if within is None else answer_within(within, look)
        if answer is None:  # the last count stays; this process is to end past Ray's C++
            end_now.set()  # teardown (errors.end_now), as a thread of it waits in a GCS call
            return
        total, new = answer
        if new:
            self.on_fault("runner_restarts", total - self.runner_restarts,
                          "env runner(s) restarted by Ray")
            self.runner_restarts = total

    def _count_restarts(self) -> int:
        """Restarts of all runners so far; a GCS that does not answer keeps the last count
        (a row must not fail over a counter)."""
        try:
            return sum(num_restarts(actor_id) for actor_id in self.runner_ids)
        except Exception:  # noqa: BLE001 - any GCS client error
            return self.runner_restarts

    def _wait_until_alive(self, i: int) -> None:
        """Ray is restarting runner i (its constructor builds fresh envs); wait for it, reading
        the actor table meanwhile (_get): a restart killed while it starts is counted now, not
        once a later one answers, which a driver killed in between would never see."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                self._get(self.runners[i].pid.remote(),
                          timeout=max(deadline - time.monotonic(), 0.0))
                return
            except RayActorError:
                self._note_restarts()
                time.sleep(0.5)
            except GetTimeoutError:
                break
        raise RunnerFailure(f"env runner {i} ({self.cfg.env.env_id}) did not come back within "
                            f"{RESTART_TIMEOUT_S:.0f} s after its process died")

    # -- learning ---------------------------------------------------------------------------
    def learn(self, runner_batches: list | None, iteration: int) -> dict:
        """runner_batches: [(batch ref, num_envs)] in runner order; learner k trains on envs
        [k*S, (k+1)*S) of their concatenation, S = num_envs / num_learners. None: each
        learner trains on the rollout it sampled itself (--act-in learner)."""
        start = time.perf_counter()
        shares = [None] * len(self.learners)
        if runner_batches is not None:
            share = self.cfg.learner_num_envs
            shares = [env_shares(runner_batches, k * share, (k + 1) * share)
                      for k in range(len(self.learners))]
        # --overlap's handover watches the rollout in flight (a list: Ray passes it unresolved)
        in_flight = self.in_flight if self.placement.learner.handover else None
        refs = [learner.update.remote(mine, iteration, in_flight)
                for mine, learner in zip(shares, self.learners)]
        try:
            answers = self._get(refs)  # [(losses, seconds updating)] per learner
        except (RayActorError, ObjectLostError, GetTimeoutError) as exc:
            # ObjectLostError: it answered, and its node was removed before the answer was read
            raise learner_failure(f"a learner failed: {type(exc).__name__}") from None
        except RayTaskError as exc:
            if not lost_input(exc):
                raise
            # a runner's batch was lost with its node: rewind and sample again
            raise learner_failure(f"a learner lost its batch: {type(exc.cause).__name__}") from None
        # what the learners did not spend updating went to moving the batch and scheduling
        busy = max(seconds for _, seconds in answers)
        self.timer.add("transfer", max(time.perf_counter() - start - busy, 0.0))
        return answers[0][0]  # rank 0's losses, as ppo_atari_multigpu.py logs rank 0

    def learner_state(self) -> dict:
        try:
            ref = self.learners[0].state_dict.remote()
            # (tests: made on the learner's node and not read yet; fetch_local=False keeps it there)
            faults.pause("learner_state_made", lambda: ray.wait([ref], fetch_local=False))
            return self._get(ref)
        except (RayActorError, ObjectLostError, GetTimeoutError) as exc:
            # ObjectLostError: the state (~20 MB, in the learner node's object store) was made,
            # and that node was removed before it was read
            raise learner_failure(f"learner 0 failed: {type(exc).__name__}") from None

    def load_learner_state(self, state: dict) -> None:
        try:
            self._get([learner.load_state_dict.remote(state) for learner in self.learners])
        except (RayActorError, GetTimeoutError) as exc:
            raise learner_failure(f"a learner failed while loading its state: "
                                  f"{type(exc).__name__}") from None

    def recover_learners(self, state: Optional[dict]) -> None:
        """Replace every learner (a broken process group cannot be repaired) and restore them
        (None: fresh ones, as the run started)."""
        for learner in self.learners:
            ray.kill(learner)
        self.learners = self._make_learners()
        if state is not None:
            self.load_learner_state(state)

    def learner_weights(self) -> list[dict]:
        return self._get([learner.get_weights.remote() for learner in self.learners])

    def close(self) -> None:
        # a runner killed after its last rollout was still a fault; asked within a bound, as a
        # GCS stopped with this process (a SIGTERM to its whole process group: kill -- -PGID)
        # holds the question for 60 s, after which Ray's core ends the process
        self._note_restarts(within=CLOSE_QUERY_S)
        for actor in self.runners + self.learners:
            ray.kill(actor)


def learner_failure(what: str) -> LearnerFailure:
    """The LearnerFailure of a learner lost now, which the loop counts and recovers from; raises
    JobEnded instead where the job itself has ended (check_job_alive)."""
    check_job_alive(what)
    return LearnerFailure(what)


def check_job_alive(what: str) -> None:
    """Raise JobEnded if Ray has marked this job finished. A sweep's driver that dies takes
    its trials' actors down with the job, and a trial can see its learner die in that
    teardown before its own process is stopped: a death then is no fault of the run, so it
    must not reach the fault log (which nothing rolls back), whichever path sees it first."""
    if job_ended():
        raise JobEnded(f"{what} as Ray ended this job (its driver died); the sweep's --resume "
                       "continues the run from its last checkpoint") from None


def lost_input(exc: RayTaskError) -> bool:
    """The task failed because something it was given died with its process or node (learner
    0's weights, a runner's batch on a removed node), not because its own code raised."""
    return isinstance(exc.cause, (RayActorError, ObjectLostError))


def env_shares(runner_batches: list, lo: int, hi: int) -> list:
    """The [(ref, first, end)] pieces of the runners' batches that cover global envs [lo, hi)."""
    pieces, offset = [], 0
    for ref, n in runner_batches:
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            pieces.append((ref, a - offset, b - offset))
        offset += n
    return pieces
