"""The ``dataecho`` command. It only parses arguments and calls the library.

    dataecho demo            # the main job: train with and without echoing, print a table
    dataecho demo --help     # its options

Adding a subcommand: write ``_add_NAME(parser)`` (its options) and ``_run_NAME(args) -> int``
(the call into the library), then list them in ``COMMANDS``. Errors the user can fix (missing
data, a bad option value) print one ``dataecho NAME: error: ...`` line and exit with status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dataecho.loader import WHERE_CHOICES
from dataecho.sources.fashion_mnist import DEFAULT_DATA_DIR, DataNotFoundError, IDXFormatError

# Errors caused by the user's input or machine, reported without a traceback.
USER_ERRORS = (DataNotFoundError, IDXFormatError, ValueError)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --- demo -------------------------------------------------------------------------------------


def _add_demo(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data and upstream")
    data.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help="folder with the four Fashion-MNIST *-ubyte.gz files (default: %(default)s)",
    )
    data.add_argument(
        "--train-examples",
        type=_positive_int,
        default=None,
        metavar="N",
        help="use only the first N training examples (default: all 60,000)",
    )
    data.add_argument(
        "--upstream-ratio",
        type=_positive_float,
        default=4.0,
        metavar="R",
        help="slow the reads so one batch takes R training steps' time, calibrated "
        "on this machine (default: %(default)s)",
    )
    data.add_argument(
        "--read-delay",
        type=_non_negative_float,
        default=None,
        metavar="SECONDS",
        help="fixed seconds per example read instead of --upstream-ratio (0: no delay)",
    )
    echo = p.add_argument_group("echoing")
    echo.add_argument(
        "--echo-factor",
        type=_echo_factor,
        default=4.0,
        metavar="E",
        help="echo factor of the second run; the first always runs with 1 (default: %(default)s)",
    )
    echo.add_argument(
        "--where",
        choices=WHERE_CHOICES,
        default="before_augment",
        help="insertion point of the echo stage (default: %(default)s)",
    )
    echo.add_argument(
        "--shuffle-buffer",
        type=_non_negative_int,
        default=1024,
        metavar="N",
        help="post-echo shuffle buffer of the echoed run (default: %(default)s)",
    )
    run = p.add_argument_group("training and stopping")
    run.add_argument(
        "--target",
        type=_target,
        default=0.86,
        metavar="ACC",
        help="stop when the periodic test accuracy reaches ACC; 'off' to train the whole "
        "budget (default: %(default)s)",
    )
    run.add_argument(
        "--budget",
        type=_positive_int,
        default=240_000,
        metavar="N",
        help="stop after N fresh examples at the latest (default: %(default)s)",
    )
    run.add_argument("--batch-size", type=_positive_int, default=128, metavar="N")
    run.add_argument("--lr", type=_positive_float, default=0.05)
    run.add_argument(
        "--eval-every",
        type=_positive_int,
        default=6_000,
        metavar="N",
        help="fresh examples between evaluations and log lines (default: %(default)s)",
    )
    run.add_argument(
        "--eval-examples",
        type=_positive_int,
        default=10_000,
        metavar="N",
        help="first N test examples in those evaluations (default: all 10,000)",
    )
    run.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        help="torch threads for the training step (default: %(default)s)",
    )
    run.add_argument(
        "--workers",
        type=_non_negative_int,
        default=1,
        help="loader worker processes (default: %(default)s)",
    )
    run.add_argument("--seed", type=_non_negative_int, default=0)


def _run_demo(args: argparse.Namespace) -> int:
    from dataecho.train import TrainConfig, compare, format_results  # torch loads only here

    base = TrainConfig(
        data_dir=args.data_dir,
        train_examples=args.train_examples,
        budget=args.budget,
        target_accuracy=args.target,
        where=args.where,
        shuffle_buffer=args.shuffle_buffer,
        batch_size=args.batch_size,
        lr=args.lr,
        read_delay=args.read_delay or 0.0,
        num_workers=args.workers,
        threads=args.threads,
        eval_every=args.eval_every,
        eval_examples=args.eval_examples,
        seed=args.seed,
    )
    ratio = None if args.read_delay is not None else args.upstream_ratio
    results = compare(base, (1.0, args.echo_factor), upstream_ratio=ratio)
    print()
    print(format_results(results))
    return 0


COMMANDS = [
    Command("demo", "train a CNN on Fashion-MNIST with and without echoing; compare", _add_demo,
            _run_demo),
]  # fmt: skip


# --- plumbing ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dataecho", description="Data echoing for PyTorch: reuse data while input is slow."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dataecho`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args._run(args)
    except USER_ERRORS as err:
        print(f"dataecho {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dataecho {args.command}: interrupted", file=sys.stderr)
        return 130


# --- argument types: argparse turns their ValueError into a usage error ---------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _echo_factor(text: str) -> float:
    value = float(text)
    if not 1 <= value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a finite number >= 1 (1 = no echoing), got {text}"
        )
    return value


def _target(text: str) -> float | None:
    if text.lower() in ("off", "none"):
        return None
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be an accuracy in (0, 1] or 'off', got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
