"""Batch buckets: person batches are padded to a few fixed sizes so shapes stay static on the GPU
(cuDNN autotuning, compiled graphs and CUDA graphs each see a handful of shapes, not one per count)."""

from __future__ import annotations

BATCH_BUCKETS = (1, 2, 4, 8, 16)


def bucket(n: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int:
    """Smallest bucket holding n (multiples of the largest beyond it)."""
    for b in buckets:
        if n <= b:
            return b
    top = buckets[-1]
    return -(-n // top) * top


def bucket_sizes(max_batch: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> list[int]:
    """Every bucket a batch of 1..max_batch lands in, ascending."""
    return sorted({bucket(n, buckets) for n in range(1, max(1, max_batch) + 1)})
