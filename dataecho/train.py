"""``dataecho train``: train through ``EchoingDataLoader`` from a slow upstream, to a target.

    dataecho prepare --out shards/                        # Fashion-MNIST as WebDataset shards
    dataecho train --upstream shards/ --echo-factor 4 --shuffle-buffer 1280 --progress
    dataecho train --config run.toml --checkpoint-dir ckpt/ --resume   # every option: --help

or from Python::

    from dataecho.train import TrainConfig, train
    result = train(TrainConfig(echo_factor=4, read_delay=0.0006, target_accuracy=0.85))

Data flows: the upstream (in memory behind ``Throttled``, or shards over HTTP, on disk or on
emulated storage: :mod:`dataecho.upstream`) -> an ``EchoingDataLoader`` worker (read, decode,
echo, shuffle, augment, batch) -> this loop (one optimizer step per batch). The paper's measure
of cost is *fresh examples*, those read from upstream; echoed copies are extra steps, not data.

Time: ``wall_seconds`` runs from the first batch request to the last step, the periodic
evaluations and checkpoint writes included: they are part of what a user waits for. Building
the data before and the final whole-split evaluation after are outside it.

Threads: on the 2-core target machine the step runs on 1 torch thread here and the upstream
in 1 loader worker on the other core (the defaults). Wall seconds of 18,000 fresh examples,
e=1 / e=4, from ``dataecho train --read-delay 0.0006 --target-accuracy off --budget 18000
--threads T --num-workers W --echo-factor E`` (e=4 with a 1,024-example shuffle buffer; measured
with this loop's predecessor, same loader and step, on 2 cores shared with other jobs: rough):

    1 thread,  1 worker    12.7 / 19.9   <- the defaults
    2 threads, 1 worker    12.5 / 54.0   (step and worker fight for the cores)
    1 thread,  0 workers   14.1 / 28.7   (reads and augmentation stall the step)
    2 threads, 0 workers   18.3 / 26.0

Checkpoints (``checkpoint_dir``): every ``checkpoint_every`` steps and at the end, the model,
optimizer, loader state, counters, history and the loop's RNG, written atomically
(:mod:`dataecho.checkpoint`). ``resume`` continues from the latest one. With
``checkpoint_on_exit``, SIGINT or SIGTERM also writes one at the step reached (the step under
way finishes first; a wait for data is cut short) before the run stops
(:mod:`dataecho.shutdown`). An in-memory upstream is map-style and resumes exactly where the
checkpoint was without re-reading anything; a shard upstream resumes from its own
checkpointed position (per worker): finished shards are not read again, and the current one
is read past its consumed records without decoding them.
With a fixed seed and ``num_workers`` 0 or 1, a resumed run's batches and losses equal those
of the uninterrupted run. ``echo_factor="auto"`` depends on timing: a resume continues its
stream without losing or doubling fresh examples, but not identically. Wall time after a
resume continues from the checkpoint's; the time between that checkpoint and the crash is lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dataecho.checkpoint import (
    CheckpointError,
    check_same,
    checkpoint_to_resume,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from dataecho.config import TrainConfig
from dataecho.distributed.group import in_torchrun
from dataecho.evaluation import BackgroundEvaluator
from dataecho.loader import EchoingDataLoader
from dataecho.profiling import ProfileReport, profile
from dataecho.progress import TrainingProgress
from dataecho.shutdown import ExitCheckpoint
from dataecho.upstream import Data, build_data
from dataecho.workloads import char_lm
from dataecho.workloads.cnn import SmallCNN, evaluate

__all__ = ["TrainConfig", "TrainResult", "measure_step_seconds", "train"]

# Settings that shape the stream or the model: a checkpoint continues only a run that had them.
RESUME_MUST_MATCH = ("workload", "seq_len", "augment_pad", "train_examples", "echo_factor", "max_echo_factor",
                     "where", "shuffle_buffer", "batch_size", "lr", "momentum", "num_workers",
                     "seed")  # fmt: skip


@dataclass
class TrainResult:
    """What one run cost and reached. ``history`` has one row per evaluation with the keys
    fresh, steps, seconds (wall since the start), accuracy (cnn) or val_loss (char-lm),
    train_loss, realized_factor and stall (the last three over the interval since the row
    before)."""

    config: TrainConfig
    test_accuracy: float | None  # cnn: whole test set, at the end (None for char-lm)
    test_loss: float  # cross-entropy on the whole test (cnn) / validation (char-lm) split
    fresh_examples: int  # read from upstream
    echoed_examples: int  # extra copies trained on
    steps: int
    wall_seconds: float  # evaluations and checkpoints included (module docstring)
    wait_seconds: float  # blocked on the loader
    step_seconds: float  # forward, backward, update
    eval_seconds: float
    checkpoint_seconds: float
    realized_factor: float  # examples trained on / fresh examples
    reached_target: bool | None  # None when no target was set
    fresh_to_target: int | None = None  # at the first evaluation that reached it
    steps_to_target: int | None = None
    seconds_to_target: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # training loss of every step

    @property
    def stall_fraction(self) -> float:
        """Share of the wall time the loop waited for data."""
        return self.wait_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def val_loss(self) -> float | None:
        """char-lm: final validation cross-entropy, nats per character."""
        return self.test_loss if self.config.workload == "char-lm" else None


@dataclass
class _Run:
    """The loop's counters: all of it goes into a checkpoint, so a resume continues them."""

    steps: int = 0
    epoch: int = 0
    next_eval: int = 0
    seconds: float = 0.0  # wall time up to the last checkpoint (a resume starts from it)
    step_seconds: float = 0.0
    eval_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    loss_sum: float = 0.0  # training loss since the last evaluation
    loss_count: int = 0
    mark: list[float] = field(default_factory=lambda: [0, 0, 0.0, 0.0])  # at the last eval:
    # fresh, examples out, wait seconds, wall seconds
    to_target: list[float] | None = None  # fresh, steps, seconds at the first target hit
    done: bool = False


def train(config: TrainConfig, log: Callable[[str], None] = print) -> TrainResult:
    """Train as ``config`` says; log one line per evaluation. See the module docstring."""
    cfg = config
    if cfg.nproc > 1 or in_torchrun():  # data parallel: dataecho.distributed
        from dataecho.distributed import run_distributed

        return run_distributed(cfg, log)
    with _torch_threads(cfg.threads):  # why 1: the module docstring's table
        torch.manual_seed(cfg.seed)  # the model's initial weights
        data = build_data(cfg)
        model, optimizer = _model(cfg, data)
        loader = make_loader(cfg, data)
        run, history, losses = _Run(next_eval=cfg.eval_every), [], []
        if cfg.checkpoint_dir is not None:
            run, history, losses = _resume_or_start(cfg, data, model, optimizer, loader, run, log)
        say = _logger(cfg, log)
        say(f"[{cfg.name}] upstream: {data.description}")

        bar = TrainingProgress(loader, desc=cfg.name, batch_size=cfg.batch_size,
                               disable=not cfg.progress, total_steps=cfg.max_steps)  # fmt: skip
        start = time.perf_counter() - run.seconds  # after a resume: the checkpoint's wall time
        save = functools.partial(_save_on_exit, cfg, run, model, optimizer, loader, data,
                                 history, losses, start)  # fmt: skip
        on_exit = ExitCheckpoint(loader, save if cfg.checkpoint_on_exit else None, log=say,
                                 label=cfg.name)  # signals: dataecho.shutdown  # fmt: skip
        evaluate_snapshot = functools.partial(_periodic_evaluation, cfg, split=data.eval_set)
        evaluator = (
            BackgroundEvaluator(model, evaluate_snapshot) if cfg.eval_in_background else None
        )
        with bar, loader, on_exit, evaluator or contextlib.nullcontext():
            # on the way out: handlers restored, workers and evaluation thread stopped, bar
            while not run.done:  # one pass of the loader: one epoch of fresh data
                data.set_epoch(run.epoch)
                for batch in on_exit.batches(bar.wrap(loader)):
                    t0 = time.perf_counter()
                    loss = _loss(cfg, model, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    run.step_seconds += time.perf_counter() - t0
                    run.steps += 1
                    losses.append(loss.item())
                    run.loss_sum, run.loss_count = run.loss_sum + losses[-1], run.loss_count + 1

                    _evaluations(cfg, run, model, loader, data, history, start, say, evaluator)
                    if cfg.checkpoint_dir and (run.done or run.steps % cfg.checkpoint_every == 0):
                        run.seconds = time.perf_counter() - start
                        _save(cfg, run, model, optimizer, loader, data, history, losses)
                    on_exit.after_step()  # a signal during the step: checkpoint, then stop
                    if run.done:
                        break
                else:
                    run.epoch += 1
                    if loader.stats.fresh_examples == 0:
                        raise ValueError(
                            f"the loader gave no batch of {cfg.batch_size}: the training set "
                            f"has {_size(data)} examples; use a smaller batch_size or more"
                        )
            run.seconds = time.perf_counter() - start
        # Stopped at a target found in the background: the final figures are those of the
        # weights that reached it (the evaluator's snapshot), as they are in line.
        at_target = evaluator is not None and run.to_target is not None and cfg.stop_at_target
        final = _evaluate(cfg, evaluator.snapshot if at_target else model, data.final_set,
                          full=True)  # fmt: skip
    return _result(cfg, run, loader, final, history, losses)


def make_loader(cfg: TrainConfig, data: Data) -> EchoingDataLoader:
    """The echoing loader of ``cfg`` over ``data.train`` (also what ``dataecho profile`` times)."""
    return EchoingDataLoader(
        data.train,
        batch_size=cfg.batch_size,
        echo_factor=cfg.echo_factor,
        max_echo_factor=cfg.max_echo_factor,
        reuse_buffer=cfg.reuse_buffer,
        reuse_policy=cfg.reuse_policy,
        where=cfg.where,
        shuffle_buffer=cfg.shuffle_buffer,
        transform=data.transform,
        batch_transform=data.batch_transform,
        num_workers=cfg.num_workers,
        seed=cfg.seed,
        shuffle=True,
        drop_last=True,
        # Without checkpoints the workers need not send their state (shuffle buffer
        # included) every few batches; with them, the loader's default keeps a resume's
        # replay short.
        **({} if cfg.checkpoint_dir else {"snapshot_every_n_steps": 1 << 30}),
    )


def profile_run(cfg: TrainConfig, seconds: float = 10.0) -> ProfileReport:
    """Is the run ``cfg`` describes input-bound? Times its real upstream and its real step."""
    with _torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        data = build_data(cfg)
        model, optimizer = _model(cfg, data)

        def step(batch: Any) -> None:
            loss = _loss(cfg, model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        loader = make_loader(cfg, data)
        try:
            return profile(loader, step, seconds=seconds)
        finally:
            loader.close()


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch's thread count set to ``n`` inside, the caller's restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- the workload: model, loss, evaluation ---------------------------------------------------


def _model(cfg: TrainConfig, data: Data) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    if cfg.workload == "cnn":
        model = SmallCNN()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
        return model, opt
    model = char_lm.CharTransformer(char_lm.CharLMConfig(data.vocab_size, context=cfg.seq_len))
    return model, char_lm.make_optimizer(model, lr=cfg.lr)


def _loss(cfg: TrainConfig, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    if cfg.workload == "cnn":
        return F.cross_entropy(model(inputs), targets)
    return char_lm.lm_loss(model, inputs, targets)


def _evaluate(cfg: TrainConfig, model: torch.nn.Module, split: tuple, full: bool = False) -> Any:
    """Accuracy (cnn) or validation loss (char-lm); with ``full``: (accuracy or None, loss)."""
    if cfg.workload == "cnn":
        r = evaluate(model, split)
        return (r.accuracy, r.loss) if full else r.accuracy
    inputs, targets = split
    batches = ((inputs[i : i + 256], targets[i : i + 256]) for i in range(0, len(inputs), 256))
    loss = char_lm.evaluate(model, batches)
    return (None, loss) if full else loss


def _at_limit(cfg: TrainConfig, run: _Run, fresh: int) -> bool:
    return fresh >= cfg.budget or (cfg.max_steps is not None and run.steps >= cfg.max_steps)


def _evaluations(
    cfg: TrainConfig, run: _Run, model: torch.nn.Module, loader: EchoingDataLoader, data: Data,
    history: list, start: float, say: Callable[[str], None],
    evaluator: BackgroundEvaluator | None,
) -> None:  # fmt: skip
    """After a step: evaluate when the schedule says so (in line, or handed to ``evaluator``),
    log what finished and decide whether the run is done."""
    fresh = loader.stats.fresh_examples
    at_limit = _at_limit(cfg, run, fresh)
    due = fresh >= run.next_eval or at_limit
    if due:
        run.next_eval = (fresh // cfg.eval_every + 1) * cfg.eval_every
    t0 = time.perf_counter()
    if evaluator is None:
        if due:
            result = _periodic_evaluation(cfg, model, data.eval_set)
            run.eval_seconds += time.perf_counter() - t0
            row = _history_row(cfg, run, loader, *result, time.perf_counter() - start)
            _took(cfg, run, history, say, row, result, row["seconds"])
    else:
        # Results first (one snapshot at a time: a due evaluation waits for the last), so
        # that a run done at its target keeps that target's snapshot in the evaluator.
        for row, result in evaluator.wait() if due else evaluator.poll():
            _took(cfg, run, history, say, row, result, time.perf_counter() - start)
        if due and not run.done:  # the row: the snapshot's figures; its metric comes later
            row = _history_row(cfg, run, loader, float("nan"), 0, time.perf_counter() - start)
            evaluator.submit(model, row)
            if at_limit:
                for row, result in evaluator.wait():
                    _took(cfg, run, history, say, row, result, time.perf_counter() - start)
        run.eval_seconds += (time.perf_counter() - t0) if due else 0.0
    run.done = run.done or at_limit


def _took(
    cfg: TrainConfig, run: _Run, history: list, say: Callable[[str], None],
    row: dict[str, float], result: tuple[float, int], known: float,
) -> None:  # fmt: skip
    """Record one finished evaluation; ``known``: when the run learned its result."""
    metric, screened = result
    row.update({_metric_key(cfg): metric, "screened": screened})
    history.append(row)
    say(_log_line(cfg, row))
    reached = cfg.target is not None and not screened and _better(cfg, metric, cfg.target)
    if reached and run.to_target is None:
        run.to_target = [row["fresh"], row["steps"], known]
    run.done = run.done or (reached and cfg.stop_at_target)


def _metric_key(cfg: TrainConfig) -> str:
    return "accuracy" if cfg.workload == "cnn" else "val_loss"


def _periodic_evaluation(cfg: TrainConfig, model: torch.nn.Module, split: tuple) -> tuple:
    """``(metric, screened)``: with ``screen_examples``, a cheap look first.

    Evaluations cost wall time, and a run echoing e times evaluates as often per fresh example
    as one without: the screen (e.g. 1,000 of 5,000 examples, a fifth of the time) answers
    "far from the target" cheaply; only a screen within ``screen_margin`` of the target pays
    for the full evaluation, which alone decides whether the target is reached.
    """
    n, (inputs, targets) = cfg.screen_examples, split
    if n and cfg.target is not None and n < len(inputs):
        screen = _evaluate(cfg, model, (inputs[:n], targets[:n]))
        near = cfg.target - cfg.screen_margin if cfg.workload == "cnn" else (
            cfg.target + cfg.screen_margin)  # fmt: skip
        if not _better(cfg, screen, near):
            return screen, 1
        # The screen was the full evaluation's first n examples: only the rest remain to do.
        rest = _evaluate(cfg, model, (inputs[n:], targets[n:]))
        total = screen * n + rest * (len(inputs) - n)
        # cnn: whole counts of correct answers, so the same float as one pass over all
        return (round(total) if cfg.workload == "cnn" else total) / len(inputs), 0
    return _evaluate(cfg, model, split), 0


def _better(cfg: TrainConfig, metric: float, target: float) -> bool:
    return metric >= target if cfg.workload == "cnn" else metric <= target


def measure_step_seconds(
    batch_size: int = 128, threads: int = 1, steps: int = 15, *, workload: str = "cnn",
    seq_len: int = 64,
) -> float:  # fmt: skip
    """Seconds per training step on a synthetic batch (t_down) on ``threads`` torch threads,
    median after warm-up steps; the caller's thread count is restored after."""
    with _torch_threads(threads):
        if workload == "char-lm":  # 82: the Austen vocabulary's size, <unk> included
            lm = char_lm.CharLMConfig(82, context=seq_len)
            return char_lm.measure_step_seconds(lm, batch_size, steps=steps)
        model = SmallCNN()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
        times = []
        for _ in range(steps + 3):  # 3 warm-up steps: first calls allocate and pick kernels
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[3:])


# --- logging, history, result ----------------------------------------------------------------


def _logger(cfg: TrainConfig, log: Callable[[str], None]) -> Callable[[str], None]:
    if not cfg.progress:
        return log

    def say(line: str) -> None:
        with tqdm.external_write_mode():  # the line goes above the live bar, not through it
            log(line)

    return say


def _history_row(
    cfg: TrainConfig,
    run: _Run,
    loader: EchoingDataLoader,
    metric: float,
    screened: int,
    seconds: float,
) -> dict[str, float]:
    s = loader.stats
    fresh0, out0, wait0, seconds0 = run.mark
    row = {
        "fresh": s.fresh_examples,
        "steps": run.steps,
        "seconds": seconds,
        _metric_key(cfg): metric,
        "train_loss": run.loss_sum / max(run.loss_count, 1),
        "realized_factor": (s.examples_out - out0) / max(s.fresh_examples - fresh0, 1),
        "stall": (s.wait_seconds - wait0) / max(seconds - seconds0, 1e-9),
        # Cumulative: R = time per step over compute per step, evaluations excluded, between
        # any two rows (what the demo's calibration measures on the real loop).
        "step_seconds": run.step_seconds,
        "eval_seconds": run.eval_seconds,
        "screened": screened,  # 1: only the cheap screen ran (see _periodic_evaluation)
    }
    run.mark = [s.fresh_examples, s.examples_out, s.wait_seconds, seconds]
    run.loss_sum, run.loss_count = 0.0, 0
    return row


def _log_line(cfg: TrainConfig, row: dict[str, float]) -> str:
    metric = (f"test acc {row['accuracy']:.4f}" if cfg.workload == "cnn"
              else f"val loss {row['val_loss']:.3f}")  # fmt: skip
    return (
        f"[{cfg.name}] step {row['steps']:6,d} | fresh {row['fresh']:8,d} | "
        f"echo {row['realized_factor']:4.2f}x | stall {row['stall']:4.0%} | "
        f"loss {row['train_loss']:.3f} | {metric} | {row['seconds']:6.1f} s"
    )


def _result(
    cfg: TrainConfig, run: _Run, loader: EchoingDataLoader, final: tuple, history: list,
    losses: list[float],
) -> TrainResult:  # fmt: skip
    s = loader.stats
    reached = None if cfg.target is None else run.to_target is not None
    fresh_t, steps_t, seconds_t = run.to_target or (None, None, None)
    return TrainResult(
        config=cfg,
        test_accuracy=final[0],
        test_loss=final[1],
        fresh_examples=s.fresh_examples,
        echoed_examples=s.echoed_examples,
        steps=run.steps,
        wall_seconds=run.seconds,
        wait_seconds=s.wait_seconds,
        step_seconds=run.step_seconds,
        eval_seconds=run.eval_seconds,
        checkpoint_seconds=run.checkpoint_seconds,
        realized_factor=s.realized_factor,
        reached_target=reached,
        fresh_to_target=None if fresh_t is None else int(fresh_t),
        steps_to_target=None if steps_t is None else int(steps_t),
        seconds_to_target=seconds_t,
        history=history,
        losses=losses,
    )


def _size(data: Data) -> str:
    n = getattr(data.train, "num_examples", None)
    return f"{n if n is not None else len(data.train):,}"


# --- checkpoints -----------------------------------------------------------------------------


def _save(cfg, run, model, optimizer, loader, data, history, losses, loader_state=None):  # noqa: ANN001, ANN202
    t0 = time.perf_counter()
    state = {
        "config": cfg.to_dict(),
        "data": data.identity,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": loader.state_dict() if loader_state is None else loader_state,
        "run": dataclasses.asdict(run),
        "history": history,
        "losses": torch.tensor(losses, dtype=torch.float64),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    path = save_checkpoint(cfg.checkpoint_dir, state, step=run.steps, keep=cfg.keep_checkpoints)
    run.checkpoint_seconds += time.perf_counter() - t0
    return path


def _save_on_exit(cfg, run, model, optimizer, loader, data, history, losses, start, state):  # noqa: ANN001, ANN202
    """The final checkpoint of a signalled run (:mod:`dataecho.shutdown`); a step already
    checkpointed (periodically, at the end, or the one resumed from) is not written again."""
    found = list_checkpoints(cfg.checkpoint_dir)
    if found and found[-1][0] == run.steps:
        return found[-1][1]
    run.seconds = time.perf_counter() - start
    return _save(cfg, run, model, optimizer, loader, data, history, losses, state)


def _resume_or_start(cfg, data, model, optimizer, loader, run, log):  # noqa: ANN001, ANN202
    """Load the latest checkpoint when resuming; refuse to mix a new run into an old folder."""
    path = checkpoint_to_resume(cfg.checkpoint_dir, cfg.resume)
    if not cfg.resume:
        return run, [], []
    if path is None:
        log(f"[{cfg.name}] no checkpoint in {cfg.checkpoint_dir} yet: starting from the beginning")
        return run, [], []
    ckpt = load_checkpoint(path)
    check_same(ckpt["config"], cfg.to_dict(), RESUME_MUST_MATCH, path)
    if ckpt["data"] != data.identity:
        raise CheckpointError(
            f"{path} was trained on other data ({ckpt['data']}) than this upstream has "
            f"({data.identity}); point the upstream at the data it was trained on"
        )
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    random.setstate(ckpt["rng"]["python"])
    run = _Run(**ckpt["run"])
    # A finished run continues only if this config allows more (a larger budget or max_steps).
    reached = run.to_target is not None and cfg.stop_at_target and cfg.target is not None
    run.done = reached or _at_limit(cfg, run, loader.stats.fresh_examples)
    log(f"[{cfg.name}] resumed from {path}: step {run.steps:,}, "
        f"{loader.stats.fresh_examples:,} fresh examples, {run.seconds:.1f} s")  # fmt: skip
    return run, list(ckpt["history"]), ckpt["losses"].tolist()
