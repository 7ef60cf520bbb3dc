"""``TrainConfig``: one training run's settings, checked once, from Python, flags or a TOML file.

    cfg = TrainConfig(workload="cnn", upstream="http://127.0.0.1:8080", echo_factor=4)
    cfg = config_from("run.toml", {"echo_factor": "auto"})   # the file, then overrides

Every field carries its check and help text (``metadata``), so the ``dataecho train`` flags, the
TOML keys and the Python API are one list and give the same errors: the key, the value seen, the
valid range. TOML keys are spelt as the flags (``echo-factor``) or as the fields
(``echo_factor``). Fields left ``None`` that have a per-workload default are filled in from
:data:`WORKLOAD_DEFAULTS` on construction, so a built config holds concrete values only.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataecho.app.config_checks import (
    MAX_ECHO_FACTOR,
    Bool,
    Check,
    Choice,
    EchoFactor,
    Int,
    PathValue,
    Real,
    Text,
    UpstreamSpec,
)
from dataecho.loader import WHERE_CHOICES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (pyproject pulls tomli in for 3.10)
    import tomli as tomllib

WORKLOADS = ("cnn", "char-lm")
SYNC_MODES = ("ddp", "local-echo")  # data-parallel runs: dataecho.app.distributed
# What "None" means for these fields, per workload (see the module docstring).
WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    # SmallCNN + SGD. An evaluation of 5,000 test images costs ~0.3 s on one core: ~8% of the
    # ~3.8 s a run at R ~ 4 spends reading 6,000 fresh examples (10,000 would cost twice that).
    "cnn": {"batch_size": 128, "lr": 0.05, "budget": 180_000, "eval_every": 6_000,
            "eval_examples": 5_000},
    # CharTransformer + AdamW; an example is one chunk of seq_len characters. An evaluation of
    # 512 chunks costs ~0.2 s; 3,200 fresh chunks are 100 steps of 32 (~4 s at full speed).
    "char-lm": {"batch_size": 32, "lr": 3e-3, "budget": 64_000, "eval_every": 3_200,
                "eval_examples": 512},
}  # fmt: skip
# The targets `dataecho train` uses unless told otherwise ("off" for none). 0.85: the issue's
# accuracy target; 1.8 nats/char: reached after ~20,000 fresh chunks (~30 s unthrottled).
CLI_TARGETS = {"cnn": ("target_accuracy", 0.85), "char-lm": ("target_loss", 1.8)}
# Upper limits of values that the machinery below takes in a fixed-size C number, or that no
# real run needs; above them a run would fail deep inside (an overflow in time.sleep, a socket
# or torch.manual_seed), so the config refuses them with the reason.
MAX_SEED = 2**64 - 1  # torch.manual_seed and torch.Generator take a 64-bit unsigned seed
MAX_READ_DELAY = 3600.0  # seconds per read: an hour, slower than any storage worth emulating
MAX_TIMEOUT = 86_400.0  # seconds: a day without a byte or a collective is a hang
MAX_THREADS = 1024


def _opt(default: Any, check: Check, group: str, help: str) -> Any:
    return field(default=default, metadata={"check": check, "group": group, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    """One run of ``dataecho train`` (see the module docstring). Budgets and schedules count
    *fresh* examples (read from upstream), as the paper does; echoed copies are extra steps."""

    workload: str = _opt(
        "cnn", Choice(WORKLOADS), "workload",
        "a small CNN on Fashion-MNIST, or a character-level Transformer on Jane Austen's novels",
    )  # fmt: skip
    data_dir: Path | None = _opt(
        None, PathValue(), "data",
        "Fashion-MNIST IDX folder (cnn) or janeaustenr package folder (char-lm); evaluation "
        "always reads from here (default: where the Debian package puts it)",
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
        None, Int(1, none="off"), "data",
        "in-memory upstream only: train on the first N examples (default: all)",
    )  # fmt: skip
    seq_len: int = _opt(64, Int(1), "data", "char-lm: characters per example")
    augment_pad: int = _opt(
        2, Int(0), "data",
        "cnn: random shift of up to this many pixels (pad-and-crop) before the flip; echoed "
        "copies made before augmentation differ by it (0: flip only)",
    )  # fmt: skip
    on_bad_record: str = _opt(
        "raise", Choice(("raise", "skip")), "data",
        "shard upstreams: a record that fails to decode or a truncated shard stops the run "
        "(raise) or is skipped, counted and logged (skip)",
    )  # fmt: skip
    retry_seconds: float = _opt(
        60.0, Real(0), "data",
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
    echo_factor: float | str = _opt(
        1.0, EchoFactor(), "echoing",
        "copies per fresh item (1 = off; 2.5 = 2 or 3 at random, 2.5 on average), or 'auto': "
        "echo only while fresh data is late",
    )  # fmt: skip
    max_echo_factor: float = _opt(
        4.0,
        Real(1, MAX_ECHO_FACTOR, why="the most times one fresh item is emitted: past that, "
             "reuse only repeats the same data; use max_echo_factor=2 to 16 (the papers' range)"),
        "echoing", "with echo factor 'auto': the most copies of one item",
    )  # fmt: skip
    reuse_buffer: int | None = _opt(
        None, Int(1, none="default"), "echoing",
        "with echo factor 'auto': how many recent fresh items a copy may be drawn from "
        "(default: one batch of examples, or 1 batch for where=batch)",
    )  # fmt: skip
    reuse_policy: str | None = _opt(
        None, Choice(("uniform", "latest", "fewest"), none="default"), "echoing",
        "with echo factor 'auto': reuse an item emitted fewest times so far, one drawn "
        "uniformly from the buffer, or the latest (default: fewest for examples, latest for "
        "batches)",
    )  # fmt: skip
    where: str = _opt(
        "before_augment", Choice(WHERE_CHOICES), "echoing", "insertion point of the echo stage"
    )
    shuffle_buffer: int = _opt(
        0, Int(0), "echoing",
        "post-echo shuffle buffer in examples (batches for where=batch); 0 = none",
    )  # fmt: skip
    batch_size: int | None = _opt(
        None, Int(1, none="default"), "training",
        "examples per step (default: 128 for cnn, 32 for char-lm)",
    )  # fmt: skip
    lr: float | None = _opt(
        None, Real(0, low_open=True, none="default"), "training",
        "learning rate (default: 0.05 with SGD for cnn, 0.003 with AdamW for char-lm)",
    )  # fmt: skip
    momentum: float = _opt(
        0.9, Real(0, 1, high_open=True), "training", "cnn: Nesterov momentum of SGD"
    )
    budget: int | None = _opt(
        None, Int(1, none="default"), "stopping",
        "stop after this many fresh examples (default: 180,000 for cnn, 64,000 for char-lm)",
    )  # fmt: skip
    max_steps: int | None = _opt(
        None, Int(1, none="off"), "stopping", "stop after this many steps (default: no limit)"
    )
    target_accuracy: float | None = _opt(
        None, Real(0, 1, low_open=True, none="off"), "stopping",
        "cnn: stop once an evaluation reaches this test accuracy ('off': no target)",
    )  # fmt: skip
    target_loss: float | None = _opt(
        None, Real(0, low_open=True, none="off"), "stopping",
        "char-lm: stop once the validation cross-entropy (nats/char) is at or below this "
        "('off': no target)",
    )  # fmt: skip
    stop_at_target: bool = _opt(
        True, Bool(), "stopping",
        "stop at the target; with --no-stop-at-target train the whole budget, still recording "
        "when the target was reached",
    )  # fmt: skip
    eval_every: int | None = _opt(
        None, Int(1, none="default"), "evaluation",
        "fresh examples between evaluations and log lines (default: 6,000 for cnn, 3,200 for "
        "char-lm); their time counts in the wall time",
    )  # fmt: skip
    eval_examples: int | None = _opt(
        None, Int(1, none="default"), "evaluation",
        "test (cnn) or validation (char-lm) examples per evaluation; the final one uses all "
        "(default: 5,000 for cnn, 512 for char-lm)",
    )  # fmt: skip
    screen_examples: int = _opt(
        0, Int(0), "evaluation",
        "with a target: evaluate first on this many of the evaluation examples, and on all of "
        "them only when that screen comes within screen-margin of the target (0 = off); the "
        "target is always decided on the full evaluation",
    )  # fmt: skip
    screen_margin: float = _opt(
        0.02, Real(0), "evaluation",
        "how far short of the target a screen may fall and still call the full evaluation "
        "(accuracy points for cnn, nats for char-lm)",
    )  # fmt: skip
    eval_in_background: bool = _opt(
        False, Bool(), "evaluation",
        "evaluate a snapshot of the weights in a background thread while training goes on "
        "(dataecho.app.evaluation); a target counts as reached when that evaluation has finished, "
        "and the run stops then, a few steps past the snapshot",
    )  # fmt: skip
    num_workers: int = _opt(
        1, Int(0), "machine",
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
    checkpoint_every: int = _opt(500, Int(1), "checkpoints", "steps between checkpoints")
    keep_checkpoints: int = _opt(2, Int(1), "checkpoints", "how many recent checkpoints to keep")
    resume: bool = _opt(
        False, Bool(), "checkpoints",
        "continue from the latest checkpoint in the checkpoint folder (start afresh if it has "
        "none yet)",
    )  # fmt: skip
    checkpoint_on_exit: bool = _opt(
        False, Bool(), "checkpoints",
        "on SIGINT (Ctrl-C) or SIGTERM write a final checkpoint at the step reached (the loader "
        "state matching the model), then stop; needs checkpoint-dir (data parallel: every rank "
        "stops after the same exchange)",
    )  # fmt: skip
    progress: bool = _opt(
        False, Bool(), "output",
        "show a live progress bar: steps/s, fresh examples/s, echo factor, stall %",
    )  # fmt: skip
    name: str = _opt("", Text(), "output", "label of the log lines (default: e=ECHO_FACTOR)")
    nproc: int = _opt(
        1, Int(1), "distributed",
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

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        for f in dataclasses.fields(self):
            set_(self, f.name, f.metadata["check"].check(f.name, getattr(self, f.name)))
        for key, value in WORKLOAD_DEFAULTS[self.workload].items():
            if getattr(self, key) is None:
                set_(self, key, value)
        if self.data_dir is None:
            set_(self, "data_dir", default_data_dir(self.workload))
        if not self.name:
            set_(self, "name", "auto" if self.echo_factor == "auto" else f"e={self.echo_factor:g}")
        self._check_combinations()

    def _check_combinations(self) -> None:
        wrong, right = ("target_loss", "target_accuracy")
        if self.workload == "char-lm":
            wrong, right = right, wrong
        if getattr(self, wrong) is not None:
            raise ValueError(
                f"{wrong}={getattr(self, wrong)!r} does not apply to workload="
                f"{self.workload!r}; set {right} instead"
            )
        if self.upstream is not None:
            for key, off in (("read_delay", 0.0), ("train_examples", None)):
                if getattr(self, key) != off:
                    raise ValueError(
                        f"{key}={getattr(self, key)!r} applies to the in-memory upstream only, "
                        f"but upstream={self.upstream!r}; drop {key} (shards come as fast as "
                        "their server sends them; write fewer with dataecho prepare --examples)"
                    )
        if self.avg_prob != 1.0 and self.sync != "local-echo":
            raise ValueError(
                f"avg_prob={self.avg_prob!r} applies to sync='local-echo' only, but sync="
                f"{self.sync!r}; set sync='local-echo' or drop avg_prob"
            )
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir: the folder of the checkpoints")
        if self.checkpoint_on_exit and self.checkpoint_dir is None:
            raise ValueError(
                "checkpoint_on_exit=True needs checkpoint_dir: the folder the final checkpoint "
                "goes to; set checkpoint_dir (--checkpoint-dir DIR) or drop checkpoint_on_exit"
            )
        if self.eval_in_background and self.nproc > 1:
            raise ValueError(
                f"eval_in_background=True with nproc={self.nproc}: data-parallel runs evaluate "
                "in rank 0's loop; drop eval_in_background (--no-eval-in-background)"
            )

    @property
    def target(self) -> float | None:
        """The workload's target: accuracy (cnn, higher is better) or loss (char-lm, lower)."""
        return self.target_accuracy if self.workload == "cnn" else self.target_loss

    def to_dict(self) -> dict[str, Any]:
        """Plain values (paths as strings): for checkpoints, reports and TOML files."""
        return {
            k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()
        }


class ConfigError(ValueError):
    """A bad key or value in a config file or on the command line; the message says which."""


def default_data_dir(workload: str) -> Path:
    """Where the workload's Debian package installs its data."""
    if workload == "cnn":
        from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR

        return DEFAULT_DATA_DIR
    from dataecho.app.sources.austen import DEFAULT_PACKAGE_DIR  # imports rdata: only when needed

    return DEFAULT_PACKAGE_DIR


def options() -> list[dataclasses.Field]:
    """The fields of :class:`TrainConfig` in order: one flag and one TOML key each."""
    return list(dataclasses.fields(TrainConfig))


def flag(name: str) -> str:
    """The command-line flag of a field: ``echo_factor`` -> ``--echo-factor``."""
    return "--" + name.replace("_", "-")


def read_toml(path: str | Path) -> dict[str, Any]:
    """``{field name: value}`` from a TOML file; an unknown key is an error naming it."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: not a readable TOML file: {err}") from None
    names = [f.name for f in options()]
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(names)}"
            raise ConfigError(f"{path}: unknown key {key!r}; {hint}")
        out[name] = value
    return out


def config_from(
    toml_path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    cli_targets: bool = False,
) -> TrainConfig:
    """A config from ``defaults``, then a TOML file, then ``overrides`` (flags; text is parsed).

    Each value is checked on its own first, so an error names the flag or the file key it came
    from. ``cli_targets``: a workload whose target is given nowhere gets :data:`CLI_TARGETS`'.
    """
    given: dict[str, tuple[Any, str]] = {}  # name -> (value, where it came from)
    for name, value in (defaults or {}).items():
        given[name] = (value, f"default {name}")
    if toml_path is not None:
        for name, value in read_toml(toml_path).items():
            given[name] = (value, f"{toml_path}: key {name.replace('_', '-')!r}")
    for name, value in (overrides or {}).items():
        given[name] = (value, flag(name))
    fields = {f.name: f for f in options()}
    values = {}
    for name, (value, origin) in given.items():
        check: Check = fields[name].metadata["check"]
        try:
            values[name] = check.check(
                name, check.parse(value) if isinstance(value, str) else value
            )
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{origin}: {err}") from None
    if cli_targets:
        key, target = CLI_TARGETS.get(values.get("workload", "cnn"), (None, None))
        if key is not None and key not in given:
            values[key] = target
    try:
        return TrainConfig(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
