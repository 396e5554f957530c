"""Arrow's memory is handed back to the OS as soon as it is freed; numpy's when a step has many large temporaries.

A build worker runs step after step in one process (the in-process build, a Celery worker, the benchmark's
child), each reading and writing shards in batches. pyarrow's default allocator (mimalloc) keeps freed
pages for reuse, so a process's RSS ratchets up with its steps' largest batches. Measured on one partition
(benchmarks/throughput.py's child, 4000 long rows, two runs each): Arrow on jemalloc with no decay delay
peaked at 0.62 GiB against 0.65 with mimalloc (with 2048-row frames: ~120 MiB apart), in the same time.
`ARROW_DEFAULT_MEMORY_POOL`, when set, is left to decide.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import pyarrow as pa

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def release_arrow_memory_at_once() -> bool:
    """Make jemalloc, with dirty pages returned at once, pyarrow's default pool; False when the environment
    names another pool or this pyarrow has no jemalloc."""
    if os.environ.get(ARROW_POOL_ENV):
        return False
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return False
    pa.set_memory_pool(pool)
    pa.jemalloc_set_decay_ms(0)
    return True


def return_freed_heap() -> bool:
    """Hand the heap pages glibc's malloc holds free back to the OS (`malloc_trim(0)`); False without glibc.

    numpy allocates from glibc's malloc. Once a large array is freed, glibc raises its mmap threshold (up to
    32 MiB), so later arrays of that size are carved from the heap, and their pages stay resident after they
    are freed: a step with many such temporaries would hand its high-water mark on to the next step. Measured
    on the round trip of a 10x shard (benchmarks/throughput.py): 391 MiB resident after it, 328 once trimmed."""
    try:
        malloc_trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError):  # no C library found, or one without malloc_trim (musl)
        return False
    malloc_trim(0)
    return True
