"""What a process does with its threads and memory: the cores it may run on (and the guard that
keeps a Ray actor within them), GOMP_SPINCOUNT and glibc's malloc reuse. How many threads each
process gets, and in how many slices a gradient is computed, is resolve()'s
(placement/resolve.py). No torch import."""
from __future__ import annotations

import os


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def within(threads: int, num_cores: int) -> int:
    """The one clamp a process puts on the thread count resolve() gave it
    (placement/resolve.py): at most the cores it may run on. resolve() works from the CPUs Ray
    declares, and a node may declare more than its machine has (a test cluster on a small
    machine does); threads beyond the cores only contend."""
    return max(1, min(threads, num_cores))


def within_cores(threads: int) -> int:
    """within() this process's cores."""
    return within(threads, cores())


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
