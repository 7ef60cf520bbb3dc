"""One rank's training loop in a data-parallel ``dataecho train`` (torchrun sets the rank).

Every rank reads its own share of the upstream through its own ``EchoingDataLoader`` (an
in-memory dataset is strided over ranks x workers, shards are split by ``split_by_node``), so
echoed copies stay on the rank that read them. The loop is ``train``'s, with these changes:

- Decisions are taken at *exchanges* only (every step for ``ddp``, every averaging for
  ``local-echo``: :mod:`dataecho.app.distributed.sync`), from the counts summed in them, so every
  rank takes the same one at the same exchange: stop at the budget (global fresh examples) or
  ``max_steps`` (mean steps per rank), evaluate, checkpoint. A target reached at rank 0's
  evaluation is voted in the next exchange. A rank's epochs end on their own (the loop reads
  epoch after epoch), so unequal shares cannot leave a rank waiting for a collective.
- Rank 0 alone evaluates, logs and writes checkpoints; the final model is the same on every
  rank (averaged at the last exchange for ``local-echo``).
- With ``checkpoint_on_exit``, SIGINT/SIGTERM is voted in the next exchange too; every rank
  stops after it and a final checkpoint is written there (:mod:`dataecho.app.distributed.signals`).

Checkpoints and the resume rule: :mod:`dataecho.app.distributed.checkpoints`.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed as dist

from dataecho.app.config import TrainConfig
from dataecho.app.distributed.checkpoints import CheckpointMixin
from dataecho.app.distributed.group import GroupInfo, Guard, init_group, shutdown_group
from dataecho.app.distributed.result import DistributedResult, RunCounters
from dataecho.app.distributed.signals import StopSignals, stopping, void
from dataecho.app.distributed.sync import CommStats, GradientSync, ModelAveraging, fresh_batches
from dataecho.app.training.loader import make_loader
from dataecho.app.training.recipe import (
    better,
    build_model,
    evaluate_split,
    step_loss,
    torch_threads,
)
from dataecho.app.training.record import log_line, skipped_records
from dataecho.app.training.schedule import periodic_evaluation
from dataecho.app.upstream import build_data


def train_distributed(cfg: TrainConfig, log: Any = print) -> DistributedResult:
    """This rank's part of the run ``cfg`` describes (see the module docstring)."""
    info = init_group(cfg.dist_timeout)
    guard = Guard(info)
    # In before the loader's workers are forked (they then block both signals: see .signals);
    # out after the group is left (a signal forwarded meanwhile only sets a flag).
    with StopSignals(cfg.checkpoint_on_exit) as signals:
        try:
            with torch_threads(cfg.threads):
                return _Rank(cfg, info, guard, log, signals).run()
        finally:
            guard.close()
            shutdown_group()


class _Rank(CheckpointMixin):
    def __init__(self, cfg: TrainConfig, info: GroupInfo, guard: Guard, log: Any,
                 signals: StopSignals) -> None:  # fmt: skip
        self.cfg, self.info, self.guard, self.signals = cfg, info, guard, signals
        self.say = log if info.rank == 0 else (lambda line: None)
        torch.manual_seed(cfg.seed)  # the same initial model on every rank
        self.data = build_data(cfg)
        self.model, self.optimizer = build_model(cfg, self.data)
        self.model.to(info.device)
        self.loader = make_loader(cfg, self.data)
        self.stats = CommStats()
        self.run_ = RunCounters(next_eval=cfg.eval_every, next_checkpoint=cfg.checkpoint_every)
        self.history: list[dict[str, float]] = []
        self.losses: list[float] = []
        self.averaging: ModelAveraging | None = None
        if cfg.sync == "local-echo":
            self.averaging = ModelAveraging(
                self.model, guard, self.stats, avg_prob=cfg.avg_prob, seed=cfg.seed
            )
        if cfg.checkpoint_dir is not None:
            self._resume_or_start()
        if self.averaging is not None:
            self.averaging.start()
            self.gradients, self.net = None, self.model
        else:
            self.gradients = GradientSync(self.model, guard, self.stats)
            self.net = self.gradients.model

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> DistributedResult:
        cfg, run, loader = self.cfg, self.run_, self.loader
        self.say(f"[{cfg.name}] {self.info.world_size} ranks ({self.info.backend}, sync "
                 f"{cfg.sync}); rank 0 upstream: {self.data.description}")  # fmt: skip
        start = time.perf_counter() - run.seconds
        self.start, self.mark = start, [loader.stats.fresh_examples, loader.stats.examples_out,
                                        loader.stats.wait_seconds, run.seconds]  # fmt: skip
        seen = loader.stats.fresh_examples
        synced = fresh_batches(seen, cfg.batch_size)
        pending = [0, 0]  # fresh examples and steps of this rank since the last exchange
        batches, signals = self._batches(), self.signals
        try:
            while not run.done:
                got = signals.fetch(batches)
                if got is None:  # signalled, and no batch within the grace: stop
                    self._stop_on_signal(self._void_exchange())
                batch = _to(got, self.info.device)
                t0 = time.perf_counter()
                loss = step_loss(cfg, self.net, batch)
                self.optimizer.zero_grad(set_to_none=True)
                now = loader.stats.fresh_examples
                pending = [pending[0] + now - seen, pending[1] + 1]
                seen, summed = now, None
                if self.gradients is not None:
                    summed = self.gradients.exchange(loss, self._control(pending))
                    if void(summed):  # a rank has no step: none is taken
                        self._stop_on_signal(summed)
                else:
                    loss.backward()
                self.optimizer.step()
                run.step_seconds += time.perf_counter() - t0
                run.steps += 1
                self.losses.append(loss.item())
                run.loss_sum, run.loss_count = run.loss_sum + self.losses[-1], run.loss_count + 1
                if self.averaging is not None and fresh_batches(now, cfg.batch_size) > synced:
                    synced = fresh_batches(now, cfg.batch_size)  # one sync point per arrival
                    summed = self.averaging.at_sync_point(self._control(pending))
                if summed is not None:
                    if void(summed):
                        self._stop_on_signal(summed)
                    pending = [0, 0]
                    self._after_exchange(summed)
                    if stopping(summed):  # after the exchange, as a periodic checkpoint
                        self._stop_on_signal(summed)
            run.seconds = time.perf_counter() - start
            ranks = self._gather(self._counters())
        finally:
            loader.close()
        final = self._evaluate_final()
        return self._result(final, ranks)

    def _control(self, pending: list[int], void: bool = False) -> list[float]:
        """This rank's control numbers for the exchange (:data:`.sync.CONTROL`)."""
        return [*pending, float(self.run_.stop_vote), *self.signals.votes(void)]

    def _void_exchange(self) -> list[float]:
        """Join the exchange the other ranks are in or head to, without a step of ours (the
        grace after a signal is over): ddp runs a forward/backward on one evaluation example
        for its gradient round; local-echo averages at once. The sums say void: no rank uses
        this exchange's result."""
        control = self._control([0, 0], void=True)
        if self.gradients is not None:
            inputs, targets = self.data.eval_set
            loss = step_loss(self.cfg, self.net, _to((inputs[:1], targets[:1]), self.info.device))
            self.optimizer.zero_grad(set_to_none=True)
            return self.gradients.exchange(loss, control)
        assert self.averaging is not None
        return self.averaging.average(control)

    def _batches(self) -> Any:
        """This rank's batches, epoch after epoch, without end."""
        while True:
            self.data.set_epoch(self.run_.epoch)
            count = 0
            for batch in self.loader:
                count += 1
                yield batch
            if count == 0:
                raise ValueError(
                    f"rank {self.info.rank}'s loader gave no batch of {self.cfg.batch_size}: its "
                    f"share of the training set is too small; use a smaller batch_size or more data"
                )
            self.run_.epoch += 1

    def _after_exchange(self, summed: list[float]) -> None:
        """Same counts on every rank, so the same decisions: evaluate, stop, checkpoint."""
        cfg, run, world = self.cfg, self.run_, self.info.world_size
        run.fresh += round(summed[0])
        run.global_steps += round(summed[1])
        mean_steps = run.global_steps // world
        at_limit = run.fresh >= cfg.budget or (
            cfg.max_steps is not None and mean_steps >= cfg.max_steps
        )
        if summed[2] > 0 and cfg.stop_at_target:
            run.done = True
        if run.fresh >= run.next_eval or at_limit:
            if self.info.rank == 0:
                self._evaluate_now()
            run.next_eval = (run.fresh // cfg.eval_every + 1) * cfg.eval_every
        run.done = run.done or at_limit
        if cfg.checkpoint_dir is not None and (run.done or mean_steps >= run.next_checkpoint):
            run.next_checkpoint = (mean_steps // cfg.checkpoint_every + 1) * cfg.checkpoint_every
            run.seconds = time.perf_counter() - self.start
            self._checkpoint()

    def _evaluate_now(self) -> None:
        cfg, run, s = self.cfg, self.run_, self.loader.stats
        t0 = time.perf_counter()
        metric, screened = periodic_evaluation(cfg, _cpu(self.model), self.data.eval_set)
        run.eval_seconds += time.perf_counter() - t0
        seconds = time.perf_counter() - self.start
        fresh0, out0, wait0, seconds0 = self.mark
        key = "accuracy" if cfg.workload == "cnn" else "val_loss"
        row = {
            "fresh": run.fresh, "steps": run.steps, "seconds": seconds, key: metric,
            "train_loss": run.loss_sum / max(run.loss_count, 1),
            "realized_factor": (s.examples_out - out0) / max(s.fresh_examples - fresh0, 1),
            "stall": (s.wait_seconds - wait0) / max(seconds - seconds0, 1e-9),
            "screened": screened,
            "allreduce_calls": self.stats.allreduce_calls,
            "allreduce_bytes": self.stats.allreduce_bytes,
            "comm_seconds": self.stats.comm_seconds,
            "skipped_records": skipped_records(self.loader),  # rank 0's, as the counters above
        }  # fmt: skip
        self.mark = [s.fresh_examples, s.examples_out, s.wait_seconds, seconds]
        run.loss_sum, run.loss_count = 0.0, 0
        self.history.append(row)
        self.say(log_line(cfg, row) + f" | {self.stats.allreduce_calls:,} all-reduces")
        target = cfg.target
        if target is None or run.to_target is not None or screened:
            return
        if better(cfg, metric, target):
            run.to_target = [row["fresh"], row["steps"], row["seconds"]]
            run.stop_vote = True

    # --- the end -----------------------------------------------------------------------------

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.info.world_size
        t0 = time.perf_counter()
        self.guard.run("gather", lambda: dist.all_gather_object(out, obj))
        self.stats.comm_seconds += time.perf_counter() - t0
        self.stats.other_calls += 1
        return out

    def _counters(self) -> dict[str, float]:
        s = self.loader.stats
        return {"rank": self.info.rank, **self.stats.as_dict(), "fresh_examples": s.fresh_examples,
                "echoed_examples": s.echoed_examples, "steps": self.run_.steps,
                "skipped_records": skipped_records(self.loader)}  # fmt: skip

    def _evaluate_final(self) -> tuple:
        if self.info.rank != 0:
            return (None, float("nan"))
        return evaluate_split(self.cfg, _cpu(self.model), self.data.final_set, full=True)

    def _result(self, final: tuple, ranks: list[dict[str, float]]) -> DistributedResult:
        cfg, run, s = self.cfg, self.run_, self.loader.stats
        fresh_t, steps_t, seconds_t = run.to_target or (None, None, None)
        echoed = sum(int(r["echoed_examples"]) for r in ranks)
        return DistributedResult(
            config=cfg, test_accuracy=final[0], test_loss=final[1], fresh_examples=run.fresh,
            echoed_examples=echoed, steps=run.steps, wall_seconds=run.seconds,
            wait_seconds=s.wait_seconds, step_seconds=run.step_seconds,
            eval_seconds=run.eval_seconds, checkpoint_seconds=run.checkpoint_seconds,
            realized_factor=(run.fresh + echoed) / max(run.fresh, 1),
            reached_target=None if cfg.target is None else run.to_target is not None,
            fresh_to_target=None if fresh_t is None else int(fresh_t),
            steps_to_target=None if steps_t is None else int(steps_t),
            seconds_to_target=seconds_t, history=self.history, losses=self.losses,
            sync=cfg.sync, world_size=self.info.world_size, rank=self.info.rank, ranks=ranks,
            skipped_records=sum(int(r["skipped_records"]) for r in ranks),
        )  # fmt: skip


def _to(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


def _cpu(model: torch.nn.Module) -> torch.nn.Module:
    """The model on the CPU, where evaluation runs (a copy when training on a GPU)."""
    if next(model.parameters()).device.type == "cpu":
        return model
    return copy.deepcopy(model).cpu()
