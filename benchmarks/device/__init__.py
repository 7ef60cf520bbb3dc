"""Echo on the training device: correctness, steps/s against host-side echo, worker CPU.

    python -m benchmarks device                    # on a GPU: --device cuda is the default
    python -m benchmarks device --device cpu --quick

Sections (one process, cases interleaved in rounds; report in bench-results/device/):

1. correctness of ``where="device"``: each fresh batch of the no-echo loader e times in a row,
   counts fresh / out / batches; on a GPU, the same batches and counts as ``echo_device="cpu"``;
   the shift-and-flip copies of one fresh batch differ and share no memory; same seed, same
   batches; a resume from ``state_dict()`` continues bit for bit; two ranks draw different
   augmentations; the time of a ``state_dict()`` per step; on CUDA, no host sync per batch,
   a checkpoint's peak device memory and pinned host-side copies.
2. steps/s at e = 1, 2, 4, 8 of host-side batch echo (``where="batch"``, augmented in the
   worker, each copy sent to the device again) vs device-side echo (``where="device"``, each
   copy augmented on the device; and, from e = 2, with the copies' examples mixed across
   batches on the device), on an upstream paced at R x t_down per batch; each over no echo's
   steps/s and over the target 0.95 x min(e, R).
3. the loader worker's CPU per fresh batch: no echo, host-side example echo e = 4, device-side
   echo e = 4 (target: at most no echo's + 10%).

Without ``where="device"`` in the installed dataecho, the host cases run alone. Results:
``benchmarks/device/RESULTS.md``.
"""

from __future__ import annotations

from benchmarks.device.cli import main

__all__ = ["main"]
