"""An evaluation's time by chunk size, alone and beside a training step that never waits.

The demo evaluates a snapshot of its CNN on 5,000 Fashion-MNIST test images in a background
thread while training goes on, and a target counts when that evaluation has finished: its time
is a wait that every run pays once at its target, and CPU that an echoing run's step (which no
longer waits for data) shares. ``dataecho.app.workloads.cnn.evaluate`` runs the images through
the model a chunk at a time; this measures one evaluation at chunk sizes of 100 to 1,000, alone
and while the demo's step runs in a loop on another thread, one torch thread each, cases
interleaved over ``--rounds`` rounds (medians). The accuracy is the same at every chunk size
(checked): only the time changes.

    python -m benchmarks evaluation            # ~10 s
    python -m benchmarks evaluation --quick    # ~3 s, one short round
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time

import torch

from benchmarks import common
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, load_split
from dataecho.app.workloads.cnn import EVAL_CHUNK, SmallCNN, evaluate

CHUNKS = (100, EVAL_CHUNK, 500, 1000)
EXAMPLES = 5_000  # the demo's evaluation
BATCH = 128  # the demo's training batch


def test_images(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` Fashion-MNIST test images (uint8, N x 1 x 28 x 28) and labels."""
    images, labels = load_split(DEFAULT_DATA_DIR, "test")
    return torch.from_numpy(images[:n]).unsqueeze(1), torch.from_numpy(labels[:n])


class StepLoop:
    """The demo's CNN training step on one batch, in a loop on its own thread until closed;
    started once its first steps (which allocate) have run."""

    def __init__(self) -> None:
        self._stop, self._warm = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-loop", daemon=True)
        self._thread.start()
        self._warm.wait()

    def _run(self) -> None:
        step = common.SyntheticStep()
        x, y = torch.randn(BATCH, *common.IMAGE_SHAPE), torch.randint(0, 10, (BATCH,))
        for taken in itertools.count():
            if self._stop.is_set():
                return
            step(x, y)
            if taken == 3:
                self._warm.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def seconds(model: SmallCNN, split: tuple, chunk: int) -> tuple[float, float]:
    """Wall seconds of one evaluation in chunks of ``chunk``, and its accuracy."""
    start = time.perf_counter()
    accuracy = evaluate(model, split, batch_size=chunk).accuracy
    return time.perf_counter() - start, accuracy


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks evaluation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--quick", action="store_true", help="one round on 1,000 images")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    threads = common.pin_threads(1)
    rounds, n = (1, 1_000) if args.quick else (args.rounds, EXAMPLES)
    torch.manual_seed(0)  # the same model in every run: its accuracy is printed
    split, model = test_images(n), SmallCNN()
    times: dict[tuple[str, int], list[float]] = {}
    accuracies = set()
    for chunk in CHUNKS:  # warm-up: the first call at each size allocates and picks kernels
        seconds(model, split, chunk)
    for _ in range(rounds):
        for where in ("alone", "beside the step"):
            loop = StepLoop() if where != "alone" else None
            for chunk in CHUNKS:
                took, accuracy = seconds(model, split, chunk)
                times.setdefault((where, chunk), []).append(took)
                accuracies.add(accuracy)
            if loop is not None:
                loop.close()
    median = {key: statistics.median(v) for key, v in times.items()}
    last = CHUNKS[-1]
    rows = [[f"{chunk:,}" + (" (the default)" if chunk == EVAL_CHUNK else ""),
             *(f"{median[(w, chunk)] * 1e3:.0f}" for w in ("alone", "beside the step")),
             *(f"{median[(w, chunk)] / median[(w, last)]:.2f}" for w in ("alone", "beside the step"))]
            for chunk in CHUNKS]  # fmt: skip
    headers = ["chunk", "alone, ms", "beside the step, ms", f"alone / {last:,}",
               f"beside / {last:,}"]  # fmt: skip
    machine = common.machine_summary()
    print(f"one evaluation of the demo's CNN on {n:,} Fashion-MNIST test images; {threads}; "
          f"{rounds} round(s), medians; {machine['cpu']}, torch {machine['torch']}, load "
          f"{machine['load']}")  # fmt: skip
    print(common.markdown_table(headers, rows))
    same = len(accuracies) == 1
    print(f"accuracy the same at every chunk size: {'yes' if same else 'NO'} {sorted(accuracies)}")
    return 0 if same else 1
