"""What a process does with its threads and memory: the cores it may run on (and the guard that
keeps a Ray actor within them), GOMP_SPINCOUNT, glibc's malloc reuse, and the gradient slices
of --grad-shards. How many threads each process gets is resolve()'s (placement/resolve.py).
No torch import: `distppo plan` sizes runs with shard_plan."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from distppo.config import TrainConfig


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def within_cores(threads: int) -> int:
    """The one guard a Ray actor puts on the thread counts resolve() gave it
    (placement/resolve.py): at most the cores this process may run on. resolve() works from
    the CPUs Ray declares, and a node may declare more than its machine has (a test cluster
    on a small machine does); threads beyond the cores only contend."""
    return max(1, min(threads, cores()))


def set_omp_spincount(value) -> bool:
    """--omp-spincount: GOMP_SPINCOUNT for this process and the processes it starts (a local
    Ray's workers inherit it). libgomp reads it once, when torch loads: so only before that, and
    never over a GOMP_SPINCOUNT the user set. True when it was set here. A value that is not a
    number is left to the config's validation (one clear error line)."""
    import sys
    value = str(value).strip()  # as RunnerConfig normalises it: the flag's text or a stored one
    if not value.isdigit() or "GOMP_SPINCOUNT" in os.environ or "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = value
    return True


# glibc's mallopt parameters (malloc.h) and the values --malloc-reuse sets
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
REUSE_MMAP_THRESHOLDS = (1 << 30,  # blocks up to 1 GiB come from the heap, not a fresh mmap;
                         32 << 20)  # glibc < 2.35 refuses more than 32 MiB on 64-bit
REUSE_TRIM_THRESHOLD = 2**31 - 1   # the heap's free top is kept (mallopt takes an int)
_reusing = False  # whether this process has set them (they cannot be unset)


def reuse_freed_memory(on: bool) -> bool:
    """--malloc-reuse: glibc malloc keeps the memory torch frees and hands it out again, instead
    of unmapping each large block (an update's activations and gradients) and faulting it back
    in, zero-filled page by page, on the next minibatch (the cost: docs/benchmarks.md).
    The heap keeps its high-water mark. Off: glibc's own thresholds, as CleanRL runs; nothing
    is changed. Per process (each Ray actor sets its own). Returns whether this process reuses
    freed memory now: False off glibc (macOS, musl) and when off here and never set before."""
    global _reusing
    if not on or _reusing:
        return _reusing
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already has loaded
    except (OSError, AttributeError):
        return False
    mmap = any(mallopt(M_MMAP_THRESHOLD, value) for value in REUSE_MMAP_THRESHOLDS)
    _reusing = bool(mallopt(M_TRIM_THRESHOLD, REUSE_TRIM_THRESHOLD)) and mmap
    return _reusing


MIN_SLICE_SAMPLES = 64  # --grad-shards auto: smaller slices cost more per sample on one thread


@dataclass(frozen=True)
class ShardPlan:
    """--grad-shards resolved for one learner: each minibatch's gradient in `count` slices,
    each slice on `intra` torch threads (count 1: CleanRL's single pass on the learner's own)."""
    count: int
    intra: int


def shard_plan(cfg: TrainConfig, threads: int, on_cpu: bool,
               own: Optional[int] = None) -> ShardPlan:
    """--grad-shards for a learner whose update may use `threads` torch threads at its widest
    (with --overlap's handover, the handover's; `own`: its threads before the runners have
    delivered, default `threads`) and trains on `cfg`'s share of the envs.

    auto: for --overlap's handover (`own` < `threads`), one slice per thread, each of at least
    MIN_SLICE_SAMPLES samples: the slices let the update widen the moment the runners deliver
    without changing its numbers; otherwise 1, one pass (slices do not speed up a whole update:
    docs/benchmarks.md), and 1 with --compile. A number: as given. Either way 1 on a GPU (the update
    does not run on the threads) and at most one slice per sample (PPO-LSTM: per env of the
    minibatch, whose sequence stays whole). Slices take the threads between them (intra = threads //
    count, at least 1), never more than `own`, so that a slice run before the handover does not
    oversubscribe the learner's share. Fixed by the config and the node, never by timing: a seed's
    numbers do not depend on how many slices ran at once."""
    lr, p = cfg.learner, cfg.ppo
    envs = max(1, cfg.env.num_envs // lr.num_learners)  # this learner's share
    if p.algo == "ppo_lstm":  # a minibatch is whole env sequences
        most = max(1, envs // p.num_minibatches)
        samples = most * p.num_steps
    else:
        samples = most = max(1, envs * p.num_steps // p.num_minibatches)
    own = threads if own is None else own
    if not on_cpu:
        count = 1
    elif lr.grad_shards == "auto":
        hands_over = own < threads and not lr.compile
        count = min(threads, max(1, samples // MIN_SLICE_SAMPLES)) if hands_over else 1
    else:
        count = lr.grad_shards
    count = max(1, min(count, most))
    return ShardPlan(count, max(1, min(threads // count, own)))
