"""How much of echoing's fresh-example saving is the augmentation's?

    python -m benchmarks augmentation                       # pads 0-3, seeds 0-2: ~10 min
    python -m benchmarks augmentation --pads 2 --seeds 0    # one cell, ~1 min

For each augmentation shift (``--augment-pad``), seed and echo factor (1 and ``--echo-factor``)
it trains the demo's CNN to the target on the demo's shards read from disk (the same order as
over HTTP, no bandwidth cap: fresh-example counts do not depend on time, so the machine's load
does not matter) and counts the fresh examples to the target. The echoed run echoes at
``--where`` (before augmentation by default; ``device``: after the copy to the training device,
the copies' examples mixed there) with a shuffle buffer of ``--shuffle-batches`` batches' worth,
as the demo does.

The question it answers: the demo's baseline is slowed by its augmentation at an early
target; is the saving then the method's, or the augmentation's? The table gives both: fresh
examples to target per shift (is the baseline at its best?) and the saving per shift.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import common
from dataecho.app import demo
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR
from dataecho.app.train import TrainConfig, train
from dataecho.app.upstream import prepare
from dataecho.loader import WHERE_CHOICES

DEFAULT_SHARDS = Path.home() / ".cache" / "dataecho" / "shards" / "fashion-mnist-all-1000"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks augmentation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    p.add_argument("--pads", type=ints, default=[0, 1, 2, 3], help="shifts to try (default 0-3)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2], help="seeds (default 0,1,2)")
    p.add_argument("--echo-factor", type=float, default=4.0)
    p.add_argument(
        "--shuffle-batches",
        type=int,
        default=None,
        help="post-echo shuffle buffer (device: mixing pool), in batches' worth "
        "(default: the demo's for --where)",
    )
    p.add_argument(
        "--where",
        choices=WHERE_CHOICES,
        default="before_augment",
        help="insertion point of both runs (default: %(default)s)",
    )
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--eval-every", type=int, default=1000, help="fresh examples (default 1000)")
    p.add_argument("--eval-examples", type=int, default=5000)
    p.add_argument("--budget", type=int, default=150_000, help="fresh examples per run at most")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument(
        "--shards",
        type=Path,
        default=DEFAULT_SHARDS,
        help="shard folder; written from --data-dir if missing (default: the demo's)",
    )
    p.add_argument("--examples", type=int, default=None, help="with new shards: first N only")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--out", type=Path, default=common.results_dir("augmentation"))
    return p.parse_args(argv)


def fresh_to_target(args: argparse.Namespace, pad: int, seed: int, echo: float) -> int | None:
    """Fresh examples one run needed to reach the target (None: not within the budget)."""
    cfg = TrainConfig(upstream=str(args.shards), data_dir=args.data_dir, echo_factor=echo,
                      shuffle_buffer=0 if echo == 1 else shuffle_buffer(args),
                      where=args.where, augment_pad=pad, seed=seed,
                      batch_size=args.batch_size, budget=args.budget,
                      target_accuracy=args.target, eval_every=args.eval_every,
                      eval_examples=args.eval_examples, num_workers=1, threads=1,
                      name=f"pad {pad} seed {seed} e={echo:g}")  # fmt: skip
    return train(cfg, log=lambda line: None).fresh_to_target


def shuffle_buffer(args: argparse.Namespace) -> int:
    """``--shuffle-batches`` in the unit of ``--where``: batches for "batch", else examples."""
    return demo.shuffle_buffer(args.where, args.shuffle_batches, args.batch_size)


def summarize(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One table row per shift: fresh examples per seed, savings per seed, saving of the means."""
    table = []
    for pad in sorted({r["pad"] for r in rows}):
        mine = [r for r in rows if r["pad"] == pad]
        base, echoed = [r["e1"] for r in mine], [r["echoed"] for r in mine]
        per_seed = [f"{b / e:.2f}x" if b and e else "-" for b, e in zip(base, echoed, strict=True)]
        both = all(base) and all(echoed)
        mean = f"{statistics.mean(base) / statistics.mean(echoed):.2f}x" if both else "-"
        fmt = lambda xs: " / ".join(f"{x:,}" if x else "not reached" for x in xs)  # noqa: E731
        table.append([f"pad {pad} + flip" if pad else "flip only", fmt(base), fmt(echoed),
                      " / ".join(per_seed), mean])  # fmt: skip
    return table


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    common.pin_threads(1)
    if not (args.shards / "manifest.json").is_file():
        prepare(args.shards, data_dir=args.data_dir, examples=args.examples)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.out / "runs.jsonl", "w") as log:
        for pad in args.pads:
            for seed in args.seeds:
                row = {"pad": pad, "seed": seed, "e1": fresh_to_target(args, pad, seed, 1.0),
                       "echoed": fresh_to_target(args, pad, seed, args.echo_factor)}  # fmt: skip
                print(json.dumps(row), flush=True)
                log.write(json.dumps(row) + "\n")
                rows.append(row)
    seeds = ", ".join(map(str, args.seeds))
    header = ["augmentation", f"fresh to {args.target:g}, no echo (seeds {seeds})",
              f"e={args.echo_factor:g}", "saving per seed", "saving of the means"]  # fmt: skip
    print("\n" + common.markdown_table(header, summarize(rows)))
    print(f"\ncommand: python -m benchmarks augmentation {' '.join(argv)}".rstrip())
    return 0
