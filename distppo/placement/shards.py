"""--grad-shards as numbers: in how many slices a learner computes each minibatch's gradient,
and on how many threads each (core/shards.py runs them). Pure arithmetic on the config and
the learner's threads, so `distppo plan` sizes runs with it (no torch, no Ray)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from distppo.config import TrainConfig

MIN_SLICE_SAMPLES = 64  # --grad-shards auto: smaller slices cost more per sample on one thread


@dataclass(frozen=True)
class ShardPlan:
    """--grad-shards resolved for one learner: each minibatch's gradient in `count` slices,
    each slice on `intra` torch threads (count 1: CleanRL's single pass on the learner's own)."""
    count: int
    intra: int


def shard_plan(cfg: TrainConfig, threads: int, on_cpu: bool,
               own_threads: Optional[int] = None) -> ShardPlan:
    """--grad-shards for a learner whose update may use `threads` torch threads at its widest
    (with --overlap's handover, the handover's; `own_threads`: its threads before the runners
    have delivered, default `threads`) and trains on `cfg`'s share of the envs.

    auto: for --overlap's handover (`own_threads` < `threads`), one slice per thread, each of
    at least MIN_SLICE_SAMPLES samples: the slices let the update widen the moment the runners
    deliver without changing its numbers; otherwise 1, one pass (slices do not speed up a
    whole update: docs/benchmarks.md), and 1 with --compile. A number: as given. Either way 1
    on a GPU (the update does not run on the threads) and at most one slice per sample
    (PPO-LSTM: per env of the minibatch, whose sequence stays whole). Slices take the threads
    between them (intra = threads // count, at least 1), never more than `own_threads`, so
    that a slice run before the handover does not oversubscribe the learner's share. Fixed by
    the config and the node, never by timing: a seed's numbers do not depend on how many
    slices ran at once."""
    lcfg, p = cfg.learner, cfg.ppo
    envs = max(1, cfg.learner_num_envs)
    if p.algo == "ppo_lstm":  # a minibatch is whole env sequences
        most = max(1, envs // p.num_minibatches)
        samples = most * p.num_steps
    else:
        samples = most = max(1, envs * p.num_steps // p.num_minibatches)
    own = threads if own_threads is None else own_threads
    if not on_cpu:
        count = 1
    elif lcfg.grad_shards == "auto":
        hands_over = own < threads and not lcfg.compile
        count = min(threads, max(1, samples // MIN_SLICE_SAMPLES)) if hands_over else 1
    else:
        count = lcfg.grad_shards
    count = max(1, min(count, most))
    return ShardPlan(count, max(1, min(threads // count, own)))


@dataclass(frozen=True)
class LearnerSlice:
    """What resolve() gives each learner process: its torch threads, --overlap's handover
    (threads once the runners have delivered; 0: none) and its gradient slices."""
    threads: int
    handover: int
    shards: ShardPlan

    def within(self, cores: int) -> "LearnerSlice":
        """The one clamp a learner process applies, to the `cores` it may run on: resolve()
        works from the CPUs Ray declares, and a node may declare more than its machine has
        (threads beyond the cores only contend). The slice count stays, as the config holds
        it (a seed's numbers follow it); each slice's threads shrink with the learner's, as
        shard_plan() sizes them. A handover no wider than the learner's own threads is none."""
        own = max(1, min(self.threads, cores))
        wide = min(self.handover, cores)
        handover = wide if wide > own else 0
        intra = max(1, min(max(own, handover) // self.shards.count, own))
        return LearnerSlice(own, handover, ShardPlan(self.shards.count, intra))
