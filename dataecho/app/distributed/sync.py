"""How the ranks of a data-parallel run stay in agreement: ``ddp`` or ``local-echo``.

Both carry a few *control* numbers (a :class:`.control.Control`, packed: fresh examples and
steps since the last exchange, the target's stop vote, the signal votes of :mod:`.signals`)
inside the collective they make anyway, so every rank learns the run's global counts and
takes the same decisions (stop, evaluate, checkpoint) at the same exchange, with no extra
round:

- ``ddp`` (:class:`GradientSync`): ``DistributedDataParallel``; a comm hook all-reduces each
  gradient bucket, the first one with the control numbers appended. One round per step (the
  small CNN's gradients fit one 25 MB bucket), echoed steps included: ``e`` per fresh batch.
- ``local-echo`` (:class:`ModelAveraging`): steps are local; at a *sync point* (a fresh batch's
  worth of data arrived, :func:`sync_points`) parameters and floating-point buffers are
  flattened into one buffer with the control numbers and averaged in one all-reduce. With
  ``avg_prob`` p < 1 a sync point averages with probability p, drawn from a generator seeded
  identically on every rank, so all ranks skip the same ones and none waits on a collective
  the others skip. Optimizer state (momentum) stays local, as in local SGD.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from dataecho.app.distributed.control import Control
from dataecho.app.distributed.group import Guard


@dataclass
class CommStats:
    """One rank's communication counters."""

    allreduce_calls: int = 0  # all-reduce collectives (gradient buckets or model averages)
    allreduce_bytes: int = 0  # payload this rank sent into them (control numbers included)
    comm_seconds: float = 0.0  # local-echo: blocked in them; ddp: launch to completion of each
    # bucket's all-reduce (overlaps the backward pass)
    other_calls: int = 0  # setup broadcasts, checkpoint and end-of-run gathers
    sync_points: int = 0  # local-echo: fresh batches arrived (averaged or skipped)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def sync_points(fresh_examples: int, batch_size: int) -> int:
    """Sync points so far: one per ``batch_size`` fresh examples this rank has read. With
    ``where="batch"`` that is exactly one per fresh batch (its echoes add none); with example
    echoing, one per batch's worth of fresh examples (about every ``e`` steps)."""
    return fresh_examples // batch_size


class ModelAveraging:
    """``local-echo``: average the model across ranks at sync points (module docstring)."""

    def __init__(self, model: torch.nn.Module, guard: Guard, stats: CommStats, *,
                 avg_prob: float, seed: int) -> None:  # fmt: skip
        self.guard, self.stats = guard, stats
        self.world = guard.info.world_size
        self.avg_prob = avg_prob
        self._rng = torch.Generator().manual_seed(seed)  # same seed, same draws on every rank
        floats = [b for b in model.buffers() if b.is_floating_point()]  # int counters: local
        self.tensors = [p.data for p in model.parameters()] + floats
        self.numel = sum(t.numel() for t in self.tensors)
        device = self.tensors[0].device
        self.flat = torch.empty(self.numel + Control.width(), dtype=torch.float32, device=device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rng": self._rng.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._rng.set_state(state["rng"])

    def start(self) -> None:
        """Give every rank rank 0's model (after a resume, or an init on other seeds)."""
        self._pack(Control())
        self.guard.run("broadcast", lambda: dist.broadcast(self.flat, src=0))
        self.stats.other_calls += 1
        self._unpack()

    def at_sync_point(self, control: Control) -> Control | None:
        """A fresh batch arrived: average (probability ``avg_prob``) and return the control
        numbers reduced over the ranks, or None when this sync point is skipped."""
        self.stats.sync_points += 1
        if self.avg_prob < 1 and torch.rand((), generator=self._rng).item() >= self.avg_prob:
            return None
        return self.average(control)

    def average(self, control: Control) -> Control:
        """Average now, with no draw: a sync point's, or a rank's that joins the next average
        without reaching its sync point (:mod:`.signals`, a void exchange)."""
        self._pack(control)
        t0 = time.perf_counter()
        self.guard.run("model all-reduce", lambda: dist.all_reduce(self.flat))
        self.stats.comm_seconds += time.perf_counter() - t0
        self.stats.allreduce_calls += 1
        self.stats.allreduce_bytes += self.flat.numel() * self.flat.element_size()
        summed = Control.unpack(self.flat[self.numel :])
        self.flat[: self.numel].div_(self.world)
        self._unpack()
        return summed

    def _pack(self, control: Control) -> None:
        at = 0
        for t in self.tensors:
            self.flat[at : at + t.numel()].copy_(t.reshape(-1))
            at += t.numel()
        self.flat[self.numel :] = control.pack()

    @torch.no_grad()
    def _unpack(self) -> None:
        at = 0
        for t in self.tensors:
            t.copy_(self.flat[at : at + t.numel()].view_as(t))
            at += t.numel()


class GradientSync:
    """``ddp``: wrap ``model`` in DistributedDataParallel with a hook that counts its rounds
    and carries the control numbers; :meth:`exchange` runs a backward pass and returns them."""

    def __init__(self, model: torch.nn.Module, guard: Guard, stats: CommStats) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.guard, self.stats = guard, stats
        self.world = guard.info.world_size
        device = guard.info.device
        ids = [device.index] if device.type == "cuda" else None
        # DDP's constructor broadcasts rank 0's parameters: every rank starts from them.
        self.model = guard.run("DDP setup", lambda: DistributedDataParallel(model, device_ids=ids))
        self.stats.other_calls += 1
        self._control = torch.zeros(Control.width(), device=device)
        self._summed: Control | None = None
        self.model.register_comm_hook(None, self._hook)

    def exchange(self, loss: torch.Tensor, control: Control) -> Control:
        """``loss.backward()`` with gradients all-reduced; the control numbers reduced."""
        self._control.copy_(control.pack())
        self._summed = None
        self.guard.run("gradient all-reduce", loss.backward)
        assert self._summed is not None, "DDP ran no bucket through the comm hook"
        return self._summed

    # No annotations: DDP checks them against the real classes, which the module's postponed
    # (string) annotations would not match.
    def _hook(self, state, bucket):  # noqa: ANN001, ANN202
        grads = bucket.buffer()
        n = grads.numel()
        first = bucket.index() == 0
        payload = torch.cat([grads, self._control.to(grads.dtype)]) if first else grads
        self.stats.allreduce_calls += 1
        self.stats.allreduce_bytes += payload.numel() * payload.element_size()
        t0 = time.perf_counter()
        fut = dist.all_reduce(payload, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            out = f.value()[0]
            self.stats.comm_seconds += time.perf_counter() - t0
            if first:
                self._summed = Control.unpack(out[n:])
            return out[:n].div_(self.world)

        return fut.then(done)
