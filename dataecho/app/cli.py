"""The ``dataecho`` command. It only parses arguments and calls the library.

    dataecho demo                        # the main job: nginx, three runs, a report
    dataecho prepare --out shards/       # write Fashion-MNIST (or --dataset austen) as shards
    dataecho train --upstream shards/ --echo-factor 4     # one run; every option: --help
    dataecho train --config run.toml --resume             # a TOML file holds the same keys

Adding a subcommand: write ``_add_NAME(parser)`` (its options) and ``_run_NAME(args) -> int`` (the
call into the library), then list them in ``COMMANDS``. Errors the user can fix (each a
``DataechoError``: missing data or nginx, an unreachable server, a bad option or config value, a
checkpoint of another run, a checkpoint folder that cannot be written) print one
``dataecho NAME: error: ...`` line and exit with status 2; anything else, a plain ``ValueError``
too, is a bug and keeps its traceback. An error raised in a DataLoader
worker is reported by its own message (torch wraps it in "Caught X in DataLoader worker process N"
and the worker's traceback, which is printed below it). Ctrl-C exits with 130 and SIGTERM with 143,
both after every ``finally`` on the way out has run (loader workers shut down, a server the command
started stopped; with ``--checkpoint-on-exit`` a final checkpoint written: dataecho.app.shutdown);
also for ``--nproc N``, whose launcher stops the ranks first.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dataecho._validate import Bool, Int, Real
from dataecho.app import demo, workloads
from dataecho.app.config import COUNT_WHY, MAX_COUNT, MAX_SEQ_LEN, SEQ_LEN_WHY
from dataecho.app.config_file import config_from, flag, options
from dataecho.app.shutdown import Terminated, command_handlers, restore_handlers, stop_caught
from dataecho.app.upstream import DATASETS
from dataecho.errors import DataechoError

# Errors caused by the user's input or machine, reported as one line without a traceback: every
# error dataecho raises on purpose (a bad value, missing data or nginx, an unreachable server, a
# checkpoint of another run, a failed rank). A plain ValueError or OSError is a bug and keeps
# its traceback.
USER_ERRORS = (DataechoError,)
# ``profile --seconds``: each phase settles in seconds; past an hour, measuring only waits.
MAX_PROFILE_SECONDS = 3600.0
# ``prepare --examples-per-shard``: a shard is one HTTP request and one unit of a resume's
# re-read; a million Fashion-MNIST examples are ~2.3 GB in one request.
MAX_EXAMPLES_PER_SHARD = 1_000_000
SHARD_WHY = (
    "a shard is one request, re-read whole by a retry or resume; a few MB per shard, e.g. "
    "examples_per_shard=1000, keeps request overhead negligible"
)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --- train ------------------------------------------------------------------------------------

_GROUPS = {"workload": "workload", "data": "data and upstream", "echoing": "echoing",
           "training": "optimizer", "stopping": "stopping", "evaluation": "evaluation",
           "machine": "threads, workers, seed", "checkpoints": "checkpoints",
           "output": "output", "distributed": "data parallel (torchrun)"}  # fmt: skip


def _add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML file with any of the options below as keys (echo-factor = 4 or "
        "echo_factor = 4); flags given here override it",
    )
    groups = {key: p.add_argument_group(title) for key, title in _GROUPS.items()}
    targets = {w.target_key: f"{w.cli_target:g}" for w in workloads.REGISTRY.values()}
    for f in options():
        check, text = f.check, f.help
        rules = check.describe()
        default = targets.get(f.name, f.default)
        if f.name == "progress":
            default = "on when stderr is a terminal"
        if isinstance(default, float):
            default = f"{default:g}"
        shown = "" if default in (None, "") else f"default {default}"
        detail = ", ".join(s for s in (rules, shown) if s)
        help_text = f"{text}{f' [{detail}]' if detail else ''}".replace("%", "%%")
        group = groups[f.group]
        if isinstance(check, Bool):
            group.add_argument(flag(f.name), action=argparse.BooleanOptionalAction,
                               default=None, help=help_text)  # fmt: skip
        else:
            choices = getattr(check, "choices", None)  # Choice's, or the insertion points'
            metavar = None if choices else check.metavar
            group.add_argument(flag(f.name), default=None, choices=choices, metavar=metavar,
                               help=help_text)  # fmt: skip


def _run_train(args: argparse.Namespace) -> int:
    from dataecho.app.train import train  # the training machinery loads only for this command

    given = {f.name: getattr(args, f.name) for f in options() if getattr(args, f.name) is not None}
    defaults = {"progress": sys.stderr.isatty()}  # a live bar only where someone watches
    cfg = config_from(args.config, given, defaults=defaults, cli_targets=True)
    r = train(cfg)
    if getattr(r, "rank", 0) != 0:  # under torchrun: rank 0 reports for all ranks
        return 0
    target = "no target" if r.reached_target is None else (
        f"target {cfg.target:g} reached after {r.fresh_to_target:,} fresh examples, "
        f"{r.steps_to_target:,} steps, {r.seconds_to_target:.1f} s"
        if r.reached_target else f"target {cfg.target:g} not reached"
    )  # fmt: skip
    final = (f"test accuracy {r.test_accuracy:.4f}" if r.test_accuracy is not None
             else f"validation loss {r.test_loss:.4f} nats/char")  # fmt: skip
    print(
        f"[{cfg.name}] done: {final} (whole split); {target}\n"
        f"[{cfg.name}] {r.fresh_examples:,} fresh + {r.echoed_examples:,} echoed examples "
        f"(echo {r.realized_factor:.2f}x), {r.steps:,} steps, {r.wall_seconds:.1f} s wall "
        f"(evaluations {r.eval_seconds:.1f} s), stall {r.stall_fraction:.0%}"
    )
    if cfg.on_bad_record == "skip":  # what the run did not train on, beside what it did
        print(f"[{cfg.name}] {r.skipped_records:,} bad record(s) skipped (--on-bad-record "
              "skip; each is logged as a warning)")  # fmt: skip
    for line in getattr(r, "rank_summary", ()):  # data-parallel runs: counters per rank
        print(f"[{cfg.name}] {line}")
    return 0


# --- profile ----------------------------------------------------------------------------------


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seconds",
        type=Real(
            0,
            MAX_PROFILE_SECONDS,
            low_open=True,
            why="the three phases take a few seconds each to settle; an hour of "
            "measuring tells no more, e.g. --seconds 10",
        ).argparse_type("seconds"),
        default=10.0,
        help="time to spend measuring, split between the three phases (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_train(p)  # the run to profile: the same options as `dataecho train`


def _run_profile(args: argparse.Namespace) -> int:
    import json

    from dataecho.app.train import profile_run
    from dataecho.profiling import format_report

    given = {f.name: getattr(args, f.name) for f in options() if getattr(args, f.name) is not None}
    cfg = config_from(args.config, given, defaults={"progress": False}, cli_targets=True)
    report = profile_run(cfg, seconds=args.seconds)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report))
    return 0


# --- prepare ----------------------------------------------------------------------------------


def _add_prepare(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="folder for the shards and manifest.json (created if missing)")  # fmt: skip
    p.add_argument("--dataset", choices=DATASETS, default="fashion-mnist",
                   help="the training split to write (default: %(default)s)")  # fmt: skip
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="Fashion-MNIST IDX folder or janeaustenr package folder (default: "
                   "where the Debian package puts it)")  # fmt: skip
    p.add_argument("--examples", type=Int(1, high=MAX_COUNT, why=COUNT_WHY).argparse_type(
                   "examples"), default=None,
                   metavar="N", help="write only the first N examples (default: all)")  # fmt: skip
    p.add_argument("--examples-per-shard",
                   type=Int(1, high=MAX_EXAMPLES_PER_SHARD, why=SHARD_WHY).argparse_type(
                       "examples_per_shard"),
                   default=1000, metavar="N",
                   help="examples per tar shard (default: %(default)s)")  # fmt: skip
    p.add_argument("--seq-len", type=Int(1, high=MAX_SEQ_LEN, why=SEQ_LEN_WHY).argparse_type(
                   "seq_len"), default=64, metavar="N",
                   help="austen: characters per example (default: %(default)s)")  # fmt: skip


def _run_prepare(args: argparse.Namespace) -> int:
    from dataecho.app.upstream import prepare

    manifest, written = prepare(args.out, args.dataset, data_dir=args.data_dir,
                                examples=args.examples, seq_len=args.seq_len,
                                examples_per_shard=args.examples_per_shard)  # fmt: skip
    size = sum(s["bytes"] for s in manifest["shards"]) / 1e6
    what = f"{len(manifest['shards'])} shards, {manifest['total']:,} examples, {size:.1f} MB"
    if written:
        print(f"wrote {what} to {args.out}")
    else:
        print(f"{args.out} already holds these shards ({what}): nothing written")
    return 0


COMMANDS = [
    Command("demo", "train on shards served by nginx with and without echoing; write a report",
            demo.add_demo_arguments, demo.run_demo),
    Command("profile", "measure t_up, t_down and R of a run; recommend an echo factor",
            _add_profile, _run_profile),
    Command("prepare", "write a dataset once as WebDataset shards with a manifest",
            _add_prepare, _run_prepare),
    Command("train", "train a model through the echoing loader from an upstream of your choice",
            _add_train, _run_train),
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
    """Entry point of the ``dataecho`` console script; returns the exit status.

    The SIGINT and SIGTERM handlers it installs are put back on return, except after a stop by
    one of them (status 130 or 143): the process is exiting, and a repeated signal stays
    ignored through its exit (:func:`dataecho.app.shutdown.stop_caught`)."""
    args = build_parser().parse_args(argv)
    # SIGINT and SIGTERM raise KeyboardInterrupt and Terminated, once: a repeated Ctrl-C while
    # the first one unwinds is ignored, so the command still ends with 130 and its line.
    previous = command_handlers()
    try:
        return args._run(args)
    except USER_ERRORS as err:
        message, worker_traceback = _explain(err)
        print(f"dataecho {args.command}: error: {message}", file=sys.stderr)
        if worker_traceback:
            print(f"\n{worker_traceback}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _stopped(args.command, signal.SIGINT)
    except Terminated:
        return _stopped(args.command, signal.SIGTERM)
    except Exception as err:
        signum = _launcher_signal(err)
        if signum is None:
            raise
        return _stopped(args.command, signum)
    finally:
        restore_handlers(previous)


# torch's text for an exception raised in a DataLoader worker (``ExceptionWrapper.reraise``).
_WORKER_ERROR = re.compile(
    r"Caught \w+ in (?P<where>DataLoader worker process \d+)\.\n"
    r"Original (?P<traceback>Traceback \(most recent call last\):\n.*)",
    re.DOTALL,
)


def _explain(err: BaseException) -> tuple[str, str]:
    """``(message, worker traceback)`` of an error. One raised in a DataLoader worker reaches
    us re-raised with torch's text as its message ("Caught X in DataLoader worker process N",
    then the worker's whole traceback); its own message (the shard, the record, the fix) is
    the traceback's last entry. Any other error: ``(str(err), "")``."""
    text = str(err)
    found = _WORKER_ERROR.match(text)
    if found is None:
        return text, ""
    trace, where = found["traceback"].rstrip(), found["where"]
    kind, own = type(err), type(err).__name__
    for name in (f"{kind.__module__}.{kind.__qualname__}", kind.__qualname__):
        at = trace.rfind(f"\n{name}: ")  # builtins print without their module
        if at >= 0:
            own = trace[at + len(name) + 3 :]
            break
    return f"{own} (in {where}; its traceback below)", f"{where}: {trace}"


def _stopped(command: str, signum: int) -> int:
    """The line and exit status (128 + the signal's number) of a run stopped by a signal; from
    here on a repeated signal is ignored (the process exits)."""
    stop_caught(signum)
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    print(f"dataecho {command}: {word}", file=sys.stderr)
    return 128 + signum


def _launcher_signal(err: Exception) -> int | None:
    """The signal behind ``err`` when it is the elastic launcher's (``--nproc N``): it turns
    SIGINT/SIGTERM into its ``SignalException`` after stopping every rank. None otherwise."""
    api = sys.modules.get("torch.distributed.elastic.multiprocessing.api")
    if api is None or not isinstance(err, api.SignalException):
        return None
    return int(err.sigval)
