"""``TrainConfig``: one training run's settings, checked once, from Python, flags or a TOML file.

    cfg = TrainConfig(workload="cnn", upstream="http://127.0.0.1:8080", echo_factor=4)
    cfg = config_from("run.toml", {"echo_factor": "auto"})   # dataecho.app.config_file

Every setting carries its check and help text, so the ``dataecho train`` flags, the TOML keys
and the Python API are one list (:func:`dataecho.app.config_file.options`) and give the same
errors: the key, the value seen, the valid range. TrainConfig checks the training settings;
the loader's are one field, ``cfg.loader``, a :class:`~dataecho.loader.LoaderOptions` that
checks its own (:mod:`dataecho.app.loader_settings` routes them in and holds the run's limits
on them). They are spelt flat at the edges: ``TrainConfig(echo_factor=4)``, ``cfg.echo_factor``,
``--echo-factor``, ``echo-factor = 4`` (a TOML ``[loader]`` table is read as well), and
:meth:`TrainConfig.to_dict`. TOML keys are spelt as the flags (``echo-factor``) or as the fields
(``echo_factor``). Settings left ``None`` that have a per-workload default are filled in from
the workload's (:mod:`dataecho.app.workloads`) on construction, so a built config holds
concrete values only.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataecho._validate import (
    CPU_COUNT,
    MAX_WORKERS,
    WORKERS_WHY,
    Bool,
    Check,
    Choice,
    Int,
    PathValue,
    Real,
    Text,
    checked,
)
from dataecho.app import workloads
from dataecho.app.config_checks import TrainingDevice, UpstreamSpec
from dataecho.app.loader_settings import (
    LOADER_KEYS,
    run_loader,
)
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.loader import LoaderOptions

SYNC_MODES = ("ddp", "local-echo")  # data-parallel runs: dataecho.app.distributed
# Upper limits of values that the machinery below takes in a fixed-size C number, or that no
# real run needs; above them a run would fail deep inside (an overflow in time.sleep, a socket
# or torch.manual_seed), so the config refuses them with the reason.
MAX_SEED = 2**64 - 1  # torch.manual_seed and torch.Generator take a 64-bit unsigned seed
MAX_READ_DELAY = 3600.0  # seconds per read: an hour, slower than any storage worth emulating
MAX_TIMEOUT = 86_400.0  # seconds: a day without a byte or a collective is a hang
MAX_THREADS = 1024
# Each rank is a training process with its model, optimizer, a torch thread and its loader's
# workers: past 2 per CPU core they only time-share the cores, and a count the machine cannot
# start would leave the launcher spawning (and its memory growing) without end.
MAX_NPROC = 2 * CPU_COUNT
# Each kept checkpoint is a whole copy of the model, optimizer and loader state on disk.
MAX_KEEP_CHECKPOINTS = 1000
# char-lm attention holds seq_len**2 scores per head and example: 1 GiB at 16,384 characters.
MAX_SEQ_LEN = 2**14
SEQ_LEN_WHY = "attention holds seq_len**2 scores per head and example, 1 GiB at the limit; e.g. seq_len=64 to 512"
# Fashion-MNIST images are 28 pixels wide: a larger shift moves the whole image out of the crop.
MAX_AUGMENT_PAD = 28
# Counts of examples and steps (budgets, evaluation and checkpoint intervals): the schedules,
# rates and size estimates compute with them as floats, exact only up to 2**53 (9e15, millions
# of times ImageNet's training set), so a larger count would be rounded, not run.
MAX_COUNT = 2**53
COUNT_WHY = (
    "counts of examples and steps are used as floats in the schedules and rates, exact only up "
    "to 2**53; a real run counts far fewer"
)
# Learning rates: the papers' grids stop at 10 (Agarwal et al. tune 0.01..10); past that SGD and
# AdamW diverge on these workloads at the first steps.
MAX_LR = 10.0
# char-lm's loss starts near ln 256 = 5.5 nats/char (a uniform guess over bytes): a target above
# this is met by an untrained model, and a screen margin this wide always calls the full
# evaluation (accuracy lies within 1 of any target).
MAX_TARGET_LOSS = 8.0
MAX_SCREEN_MARGIN = 8.0


def _each_workload(phrase: Callable[[workloads.Workload], str]) -> str:
    """``phrase`` of every workload, for a help text: "A (cnn), B (char-lm)"."""
    return ", ".join(f"{phrase(w)} ({name})" for name, w in workloads.REGISTRY.items())


def _opt(default: Any, check: Check, group: str, help: str) -> Any:
    return field(default=default, metadata={"check": check, "group": group, "help": help})


@dataclass(frozen=True, init=False)  # __init__ below also takes the loader's settings flat
class TrainConfig:
    """One run of ``dataecho train`` (see the module docstring). Budgets and schedules count
    *fresh* examples (read from upstream), as the paper does; echoed copies are extra steps."""

    workload: str = _opt(
        "cnn", Choice(tuple(workloads.REGISTRY)), "workload",
        _each_workload(lambda w: w.summary),
    )  # fmt: skip
    data_dir: Path | None = _opt(
        None, PathValue(), "data",
        f"{_each_workload(lambda w: w.data_folder)}; evaluation always reads from here "
        "(default: where the Debian package puts it)",
    )  # fmt: skip
    upstream: str | None = _opt(
        None, UpstreamSpec(), "data",
        "where training examples come from: 'memory' (default) = in memory behind --read-delay; "
        "http://HOST:PORT[/PATH] = shards served over HTTP; a folder = shards on disk; "
        "emulated:/DIR?bandwidth=BYTES_PER_S&latency=S = emulated storage (shards: dataecho "
        "prepare)",
    )  # fmt: skip
    read_delay: float = _opt(
        0.0,
        Real(0, MAX_READ_DELAY, why="seconds each read sleeps: an hour per read is slower than "
             "any storage worth emulating; e.g. read_delay=0.0006 makes a cnn run input-bound"),
        "data",
        "in-memory upstream only: seconds each example read sleeps (emulated slow storage)",
    )  # fmt: skip
    train_examples: int | None = _opt(
        None, Int(1, none="off", high=MAX_COUNT, why=COUNT_WHY), "data",
        "in-memory upstream only: train on the first N examples (default: all)",
    )  # fmt: skip
    seq_len: int = _opt(
        64,
        Int(1, high=MAX_SEQ_LEN, why=SEQ_LEN_WHY),
        "data", "char-lm: characters per example",
    )  # fmt: skip
    augment_pad: int = _opt(
        2,
        Int(0, high=MAX_AUGMENT_PAD, why="Fashion-MNIST images are 28 pixels wide: a larger "
            "shift moves the whole image out of the crop; e.g. augment_pad=2"),
        "data",
        "cnn: random shift of up to this many pixels (pad-and-crop) before the flip; echoed "
        "copies made before augmentation differ by it (0: flip only)",
    )  # fmt: skip
    on_bad_record: str = _opt(
        "raise", Choice(("raise", "skip")), "data",
        "shard upstreams: a record that fails to decode or a truncated shard stops the run "
        "(raise) or is skipped, counted and logged (skip)",
    )  # fmt: skip
    retry_seconds: float = _opt(
        60.0,
        Real(0, MAX_TIMEOUT, why="retrying a server for more than a day waits on one that is "
             "gone; e.g. retry_seconds=60"),
        "data",
        "HTTP shard upstream: how long a stopped, stalled or dropping server is retried (with "
        "backoff) before the run stops with an error naming the shard and record",
    )  # fmt: skip
    http_timeout: float = _opt(
        30.0,
        Real(0, MAX_TIMEOUT, low_open=True,
             why="a server silent for a day is down, not slow; e.g. http_timeout=30"),
        "data",
        "HTTP shard upstream: seconds without a byte from the server before a request counts as "
        "stalled (then retried, see retry-seconds)",
    )  # fmt: skip
    http_deadline: float = _opt(
        600.0,
        Real(0, MAX_TIMEOUT, low_open=True,
             why="a request waiting on its server for a day is stalled; e.g. http_deadline=600"),
        "data",
        "HTTP shard upstream: the most seconds one request (a shard, the manifest) may spend "
        "waiting for the server (connecting, headers and body added up); a server that trickles "
        "past it counts as stalled (then retried, see retry-seconds)",
    )  # fmt: skip
    allow_cross_host_redirects: bool = _opt(
        False, Bool(), "data",
        "HTTP shard upstream: follow a redirect to another host or port (refused by default, "
        "with an error naming both)",
    )  # fmt: skip
    loader: LoaderOptions = field(
        metadata={"group": "echoing", "help": "the echoing loader's settings, one option each"}
    )
    lr: float | None = _opt(
        None,
        Real(0, MAX_LR, low_open=True, none="default",
             why="the papers' learning-rate grids stop at 10 and larger rates diverge in the "
             "first steps; e.g. lr=0.05 for cnn, lr=0.003 for char-lm"),
        "training",
        f"learning rate of the workload's optimizer: {_each_workload(lambda w: w.optimizer)}",
    )  # fmt: skip
    momentum: float = _opt(
        0.9, Real(0, 1, high_open=True), "training", "cnn: Nesterov momentum of SGD"
    )
    budget: int | None = _opt(
        None, Int(1, none="default", high=MAX_COUNT, why=COUNT_WHY), "stopping",
        "stop after this many fresh examples (in one process with --where batch or device, "
        "once the copies still due of those examples are trained on too)",
    )  # fmt: skip
    max_steps: int | None = _opt(
        None, Int(1, none="off", high=MAX_COUNT, why=COUNT_WHY), "stopping",
        "stop after this many steps (default: no limit)",
    )  # fmt: skip
    target_accuracy: float | None = _opt(
        None, Real(0, 1, low_open=True, none="off"), "stopping",
        "cnn: stop once an evaluation reaches this test accuracy ('off': no target)",
    )  # fmt: skip
    target_loss: float | None = _opt(
        None,
        Real(0, MAX_TARGET_LOSS, low_open=True, none="off",
             why="char-lm's loss starts near ln 256 = 5.5 nats/char, so a higher target is met "
             "untrained; e.g. target_loss=1.6"),
        "stopping",
        "char-lm: stop once the validation cross-entropy (nats/char) is at or below this "
        "('off': no target)",
    )  # fmt: skip
    stop_at_target: bool = _opt(
        True, Bool(), "stopping",
        "stop at the target; with --no-stop-at-target train the whole budget, still recording "
        "when the target was reached",
    )  # fmt: skip
    eval_every: int | None = _opt(
        None, Int(1, none="default", high=MAX_COUNT, why=COUNT_WHY), "evaluation",
        "fresh examples between evaluations and log lines; their time counts in the wall time",
    )  # fmt: skip
    eval_examples: int | None = _opt(
        None, Int(1, none="default", high=MAX_COUNT, why=COUNT_WHY), "evaluation",
        f"examples per evaluation, from the {_each_workload(lambda w: w.eval_split)} split; "
        "the final one uses all",
    )  # fmt: skip
    screen_examples: int = _opt(
        0, Int(0, high=MAX_COUNT, why=COUNT_WHY), "evaluation",
        "with a target: evaluate first on this many of the evaluation examples, and on all of "
        "them only when that screen comes within screen-margin of the target (0 = off); the "
        "target is always decided on the full evaluation",
    )  # fmt: skip
    screen_margin: float = _opt(
        0.02,
        Real(0, MAX_SCREEN_MARGIN, why="a margin this wide always calls the full evaluation; "
             "e.g. screen_margin=0.02"),
        "evaluation",
        "how far short of the target a screen may fall and still call the full evaluation "
        "(accuracy points for cnn, nats for char-lm)",
    )  # fmt: skip
    eval_in_background: bool = _opt(
        False, Bool(), "evaluation",
        "evaluate a copy of the weights in a background thread while training goes on "
        "(dataecho.app.evaluation); a target counts as reached when that evaluation has finished, "
        "and the run stops then, a few steps past the copy",
    )  # fmt: skip
    device: str | None = _opt(
        None, TrainingDevice(), "machine",
        "where the model and the training step run, whatever the insertion point; with "
        "where=device the batches are echoed there too, otherwise each batch is moved there "
        "in the loop (default: 'cuda' where torch.cuda.is_available(), else 'cpu'; data "
        "parallel: 'cuda' is each rank's LOCAL_RANK GPU, over NCCL, and 'cpu' is over gloo)",
    )  # fmt: skip
    num_workers: int = _opt(
        1, Int(0, high=MAX_WORKERS, why=WORKERS_WHY), "machine",
        "DataLoader worker processes that read, decode, echo and augment (0: in the training "
        "process)",
    )  # fmt: skip
    threads: int = _opt(
        1, Int(1, high=MAX_THREADS, why="more threads than cores only slow the step; e.g. "
               "threads=1 next to one loader worker on 2 cores"),
        "machine", "torch threads for the training step",
    )  # fmt: skip
    seed: int = _opt(
        0, Int(0, high=MAX_SEED, why="2**64 - 1: torch.manual_seed takes a 64-bit unsigned "
               "seed; pass the seed modulo 2**64, e.g. seed % 18446744073709551616"),
        "machine", "seed of the model, the data order, echoing and augmentation",
    )  # fmt: skip
    checkpoint_dir: Path | None = _opt(
        None, PathValue(), "checkpoints",
        "write checkpoints (model, optimizer, loader, counters, history) to this folder",
    )  # fmt: skip
    checkpoint_every: int = _opt(
        500, Int(1, high=MAX_COUNT, why=COUNT_WHY), "checkpoints", "steps between checkpoints"
    )
    keep_checkpoints: int = _opt(
        2,
        Int(1, high=MAX_KEEP_CHECKPOINTS, why="each kept checkpoint is a whole copy of the "
            "model, optimizer and loader state; keep a few, e.g. keep_checkpoints=2, and raise "
            "checkpoint_every for a longer history"),
        "checkpoints", "how many recent checkpoints to keep",
    )  # fmt: skip
    resume: bool = _opt(
        False, Bool(), "checkpoints",
        "continue from the latest checkpoint in the checkpoint folder (start afresh if it has "
        "none yet)",
    )  # fmt: skip
    checkpoint_on_exit: bool = _opt(
        False, Bool(), "checkpoints",
        "on SIGINT (Ctrl-C) or SIGTERM write a final checkpoint at the step reached (the loader "
        "state matching the model), then stop; needs checkpoint-dir (data parallel: every rank "
        "stops after the same exchange). It takes the loader's state before each wait for a "
        "batch: with where=device, a copy of the mixing pool to host memory per step",
    )  # fmt: skip
    progress: bool = _opt(
        False, Bool(), "output",
        "show a live progress bar: steps/s, fresh examples/s, echo factor, stall %",
    )  # fmt: skip
    name: str = _opt("", Text(), "output", "label of the log lines (default: e=ECHO_FACTOR)")
    nproc: int = _opt(
        1,
        Int(1, high=MAX_NPROC, why=f"each rank is a training process: at most 2 per CPU core, "
            f"and this machine has {CPU_COUNT} CPU cores, os.cpu_count(); pass fewer ranks, "
            "or for several machines run torchrun on each"),
        "distributed",
        "data-parallel ranks to start on this machine with PyTorch's launcher (torchrun); 1 = one "
        "process. Several machines: run torchrun on each (README)",
    )  # fmt: skip
    sync: str = _opt(
        "ddp", Choice(SYNC_MODES), "distributed",
        "data-parallel runs: 'ddp' all-reduces gradients every step, echoed steps included; "
        "'local-echo' takes echo steps locally and averages the model once per fresh batch",
    )  # fmt: skip
    avg_prob: float = _opt(
        1.0, Real(0, 1, low_open=True), "distributed",
        "local-echo: average at a fresh batch with this probability (the same draws on every rank)",
    )  # fmt: skip
    dist_timeout: float = _opt(
        300.0,
        Real(0, MAX_TIMEOUT, low_open=True,
             why="a rank that has not joined a collective for a day is gone; e.g. "
             "dist_timeout=300"),
        "distributed",
        "seconds a collective waits for the other ranks; then it fails naming the late rank",
    )  # fmt: skip

    def __init__(self, *, loader: LoaderOptions | None = None, **settings: Any) -> None:
        """Keywords: the fields, and each of the loader's settings flat (``echo_factor=4``),
        applied over ``loader`` (by default, ``LoaderOptions``' defaults)."""
        set_ = object.__setattr__  # frozen: normalise once, here
        own = {f.name: f for f in dataclasses.fields(self) if f.name != "loader"}
        for key in settings:
            if key not in own and key not in LOADER_KEYS:
                raise DataechoTypeError(
                    f"TrainConfig got an unexpected keyword argument {key!r}; "
                    + did_you_mean(key, setting_names())
                )
        for name, f in own.items():
            set_(self, name, checked(name, f.metadata["check"], settings.get(name, f.default)))
        workload = workloads.get(self.workload)
        for key, value in workload.defaults.items():
            if key in own and getattr(self, key) is None:
                set_(self, key, value)
        flat = {key: settings[key] for key in LOADER_KEYS if key in settings}
        set_(self, "loader", run_loader(loader, flat, workload.defaults["batch_size"]))
        if self.data_dir is None:
            set_(self, "data_dir", workload.default_data_dir())
        if not self.name:
            set_(self, "name", "auto" if self.echo_factor == "auto" else f"e={self.echo_factor:g}")
        self._check_combinations()

    def _check_combinations(self) -> None:
        right = workloads.get(self.workload).target_key
        for wrong in {w.target_key for w in workloads.REGISTRY.values()} - {right}:
            if getattr(self, wrong) is not None:
                raise DataechoValueError(
                    f"{wrong}={getattr(self, wrong)!r} does not apply to workload="
                    f"{self.workload!r}; set {right} instead"
                )
        if self.upstream is not None:
            for key, off in (("read_delay", 0.0), ("train_examples", None)):
                if getattr(self, key) != off:
                    raise DataechoValueError(
                        f"{key}={getattr(self, key)!r} applies to the in-memory upstream only, "
                        f"but upstream={self.upstream!r}; drop {key} (shards come as fast as "
                        "their server sends them; write fewer with dataecho prepare --examples)"
                    )
        if self.avg_prob != 1.0 and self.sync != "local-echo":
            raise DataechoValueError(
                f"avg_prob={self.avg_prob!r} applies to sync='local-echo' only, but sync="
                f"{self.sync!r}; set sync='local-echo' or drop avg_prob"
            )
        if self.resume and self.checkpoint_dir is None:
            raise DataechoValueError(
                "resume=True needs checkpoint_dir: the folder of the checkpoints"
            )
        if self.checkpoint_on_exit and self.checkpoint_dir is None:
            raise DataechoValueError(
                "checkpoint_on_exit=True needs checkpoint_dir: the folder the final checkpoint "
                "goes to; set checkpoint_dir (--checkpoint-dir DIR) or drop checkpoint_on_exit"
            )
        if self.eval_in_background and self.nproc > 1:
            raise DataechoValueError(
                f"eval_in_background=True with nproc={self.nproc}: data-parallel runs evaluate "
                "in rank 0's loop; drop eval_in_background (--no-eval-in-background)"
            )

    @property
    def target(self) -> float | None:
        """The workload's target: accuracy (cnn, higher is better) or loss (char-lm, lower)."""
        return getattr(self, workloads.get(self.workload).target_key)

    def to_dict(self) -> dict[str, Any]:
        """Plain values, flat (the loader's settings as their keys, None where a default was
        derived) and paths as strings: for checkpoints, reports and TOML files."""
        plain: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "loader":
                given = self.loader.as_given()
                plain.update((name, given[name]) for name in LOADER_KEYS)
            else:
                value = getattr(self, f.name)
                plain[f.name] = str(value) if isinstance(value, Path) else value
        return plain


def _flat(name: str) -> property:
    return property(
        lambda self: getattr(self.loader, name),
        doc=f"``loader.{name}``, read flat as its keyword, flag and TOML key spell it.",
    )


for _name in LOADER_KEYS:
    setattr(TrainConfig, _name, _flat(_name))


def setting_names() -> list[str]:
    """:class:`TrainConfig`'s keywords in order, the loader's flat where ``loader`` stands."""
    fields = dataclasses.fields(TrainConfig)
    return [n for f in fields for n in (LOADER_KEYS if f.name == "loader" else (f.name,))]


def did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(names)}"
