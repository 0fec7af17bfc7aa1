"""Learner: a thin Ray shell around PPOLearner (core/learner.py), plus the process-group setup
that data-parallel learners need (torch.distributed: gloo on CPU, nccl on GPU). With --act-in
learner it also holds its runner's Sampler (core/sampler.py), which acts with the learner's
own agent: the rollouts stay in this process for its updates."""
from __future__ import annotations

import collections
import datetime
import functools
import os
import socket
import time

import ray
import torch
import torch.distributed as dist

from distppo.config import TrainConfig
from distppo.core.learner import PPOLearner
from distppo.core.rollout import RolloutBatch, RolloutMeta
from distppo.core.runtime import device_name
from distppo.core.sampler import make_envs, sampler_on
from distppo.core.threads import cores, reuse_freed_memory
from distppo.core.update import GradAllReduce
from distppo.distributed.boundary import Started, host_only
from distppo.distributed.netif import bind_collectives
from distppo.errors import EnvError, UserError
from distppo.placement.shards import LearnerSlice, ShardPlan
from distppo.testing import faults

GROUP_TIMEOUT = datetime.timedelta(minutes=10)


@host_only
class Learner(Started):
    def __init__(self, cfg: TrainConfig, obs_shape: tuple | None, num_actions: int | None,
                 rank: int = 0, part: LearnerSlice | None = None,
                 video_dir: str | None = None, incarnation: int = 0):
        """cfg, part: resolve()'s (placement/resolve.py; cfg's grad_shards a number, `part`
        this learner's threads, --overlap's handover and gradient slices; None: one thread,
        one pass). --act-in learner: the env spec comes from runner `rank`'s envs, built
        here (seeded by `incarnation`, the learners' starts so far, as a restarted runner's),
        and video_dir is runner 0's."""
        # Ray sets OMP_NUM_THREADS from num_cpus (1 without); torch's own count is what the
        # update uses: resolve()'s, within this machine's cores (the one clamp). The slices
        # widen onto the runners' cores once they have delivered, so the numbers do not
        # depend on when that happens.
        part = part or LearnerSlice(1, 0, ShardPlan(1, 1))
        self.part = part.within(cores())
        torch.set_num_threads(self.part.threads)
        self.malloc_reuse = reuse_freed_memory(cfg.runner.malloc_reuse)
        # the rollouts sampled here and not yet learned on, oldest first (--overlap: two)
        self.rollouts: collections.deque = collections.deque()
        self.failed: UserError | EnvError | None = None  # raised by started()
        try:
            self._build(cfg, obs_shape, num_actions, rank,
                        video_dir if rank == 0 else None, incarnation)
        except (UserError, EnvError) as exc:
            self.failed = exc
        faults.kill_once("learner_init")

    def _build(self, cfg: TrainConfig, obs_shape: tuple | None, num_actions: int | None,
               rank: int, video_dir: str | None, incarnation: int) -> None:
        check_gpu(cfg)
        envs = None
        if cfg.runner.act_in == "learner":
            try:
                envs = make_envs(cfg, rank, video_dir, incarnation)
            except Exception as exc:  # noqa: BLE001 - any error of the env libraries, named
                raise EnvError(f"the envs of learner {rank} could not be built: "
                               f"{type(exc).__name__}: {exc}") from None
            obs_shape, num_actions = envs.spec()
        self.core = PPOLearner(cfg, obs_shape, num_actions, cfg.seed, rank,
                               shards=self.part.shards)
        self.sampler = None if envs is None else sampler_on(cfg, envs, rank, self.core.agent)

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0: this node's IP and a port the kernel picked, listened on by the group's
        store. The store has no authentication, so it listens on the node IP only, never on
        every interface as a TCPStore given a bare port would."""
        self._listener = listen_on(ray.util.get_node_ip_address())
        return self._listener.getsockname()[:2]

    def init_group(self, addr: str, port: int, rank: int, world_size: int) -> None:
        backend = "nccl" if self.core.device.type == "cuda" else "gloo"
        # gloo's and NCCL's own sockets on this node's interface, as the store's (netif.py)
        bind_collectives(ray.util.get_node_ip_address())
        if rank == 0:  # the store takes over rank 0's listening socket (rendezvous_address)
            store = dist.TCPStore(addr, port, world_size, is_master=True, timeout=GROUP_TIMEOUT,
                                  master_listen_fd=self._listener.detach(), use_libuv=False)
        else:
            store = dist.TCPStore(addr, port, world_size, is_master=False,
                                  timeout=GROUP_TIMEOUT)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=GROUP_TIMEOUT)
        self.core.sync = GradAllReduce(world_size)

    def env_spec(self) -> tuple[tuple, int]:
        return self.sampler.env_spec()

    def sample(self, version: int) -> RolloutMeta:
        """--act-in learner: its runner's rollout, acting with this learner's parameters; the
        batch stays here for an update (`shares` None), only the meta leaves."""
        self.sampler.set_weights(None, version)
        try:
            batch = self.sampler.collect()
        except Exception as exc:
            raise EnvError(f"the envs of learner {self.core.rank} failed while stepping: "
                           f"{type(exc).__name__}: {exc}") from None
        self.rollouts.append(batch)
        return batch.meta

    def update(self, shares: list | None, iteration: int, in_flight: list | None = None
               ) -> tuple[dict, float]:
        """shares: [(batch ObjectRef, first env, end env)], the runners' envs this learner
        trains on; fetched here, straight from the runners, never through the trainer. None:
        the oldest rollout this learner sampled itself (--act-in learner).
        in_flight: with --overlap, the metas (ObjectRefs, unresolved) of the rollout the runners
        sample meanwhile: once they are all ready (a runner that died counts: its restart
        samples after this update), the update's gradient slices take the handover's threads
        ([]: none in flight, the last iteration: from the start).
        Returns the losses and the seconds from the batch in hand to the update done."""
        faults.pause("learner_update")
        if shares is None:
            batch = self.rollouts.popleft()
        else:
            batches = ray.get([ref for ref, _, _ in shares])
            batch = RolloutBatch.concat([b if (lo, hi) == (0, b.num_envs)
                                         else b.env_slice(lo, hi)
                                         for b, (_, lo, hi) in zip(batches, shares)])
        fetched = time.perf_counter()
        runners_done = None
        if self.part.handover and in_flight is not None:
            runners_done = functools.partial(delivered, in_flight) if in_flight else lambda: True
        stats = self.core.update(batch, iteration, self.part.handover, runners_done)
        # the trainer's wait beyond these seconds went to moving batches (t_transfer_s)
        return stats, time.perf_counter() - fetched

    def get_weights(self) -> dict:
        return self.core.get_weights()

    def state_dict(self) -> dict:
        return self.core.state_dict()

    def load_state_dict(self, state: dict) -> None:
        faults.kill_once("learner_load")
        self.core.load_state_dict(state)

    def observed(self) -> tuple[str, str, int, bool]:
        """What only this process knows: (torch device, CUDA device name or "", the cores it
        may run on, whether freed memory is kept for reuse: --malloc-reuse applied)."""
        device = str(self.core.device)
        return device, device_name(device), cores(), self.malloc_reuse

    def placement_group_id(self) -> str | None:
        return ray.get_runtime_context().get_placement_group_id()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def cudnn_deterministic(self) -> bool:
        """This process's flag, which --torch-deterministic sets (core/seeds.py)."""
        return torch.backends.cudnn.deterministic


def check_gpu(cfg: TrainConfig) -> None:
    """Ray granted this learner a GPU but torch cannot use one: one line, not a CPU run that
    holds a GPU nobody else may use (the learner would otherwise fall back to the CPU)."""
    granted = ray.get_gpu_ids()
    if granted and cfg.learner.device != "cpu" and cfg.learner.cuda \
            and not torch.cuda.is_available():
        raise UserError(f"a GPU was granted but CUDA is not usable here: Ray gave this learner "
                        f"GPU {granted[0]} and torch {torch.__version__} (CUDA "
                        f"{torch.version.cuda or 'none'}) sees no device: use --learner-gpus 0")


def delivered(refs: list) -> bool:
    """Whether every ObjectRef in refs is ready (a value or an error), without waiting or
    fetching it here."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    return len(ready) == len(refs)


RemoteLearner = ray.remote(Learner)


def listen_on(addr: str) -> socket.socket:
    """A listening TCP socket on `addr` alone, port chosen by the kernel."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    return socket.create_server((addr, 0), family=family)
