"""What a training task is to ``dataecho train``: one :class:`Workload` object per task.

A workload names its defaults, its target and which way is better, its data (the evaluation
splits and the in-memory training split), the augmentation for each insertion point, its model
and optimizer, loss, metric and the bytes an example holds. The app asks the workload wherever
the answer depends on the task; a new task is one module defining a ``Workload`` and one line
in :data:`dataecho.app.workloads.REGISTRY`.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

if TYPE_CHECKING:
    from torch.utils.data import Dataset

Split = tuple[torch.Tensor, torch.Tensor]


class RunSettings(Protocol):
    """The settings of a run a workload reads (``dataecho.app.config.TrainConfig`` has them):
    typed here, so that the config, which looks workloads up, is not imported by them."""

    workload: str
    data_dir: Path | None
    train_examples: int | None
    seq_len: int
    augment_pad: int
    lr: float | None
    momentum: float
    eval_examples: int | None

    @property
    def where(self) -> str: ...


# The settings a workload gives a default for (TrainConfig's None means "the workload's").
DEFAULTED = ("batch_size", "lr", "budget", "eval_every", "eval_examples")


@dataclass(frozen=True)
class EvalSplits:
    """What a run evaluates on: ``eval_examples`` for the periodic evaluations, the whole split
    for the last one, and the vocabulary size where the model needs it."""

    eval_set: Split
    final_set: Split
    vocab_size: int | None = None


@dataclass(frozen=True)
class Transforms:
    """The loader's augmentation for one insertion point (see ``LoaderOptions``' fields)."""

    transform: Any = None
    batch_transform: Any = None
    device_transform: Any = None


class Workload(ABC):
    """One training task: the class attributes are its facts, the methods its parts."""

    name: ClassVar[str]  # the value of TrainConfig.workload
    dataset: ClassVar[str]  # dataecho prepare --dataset of its shards
    shard_kind: ClassVar[str]  # the manifest's "kind" of those shards
    defaults: ClassVar[Mapping[str, Any]]  # a value for each of DEFAULTED
    target_key: ClassVar[str]  # the TrainConfig field of its target
    cli_target: ClassVar[float]  # the target dataecho train uses unless told otherwise
    metric: ClassVar[str]  # the history rows' key of its evaluation metric
    higher_is_better: ClassVar[bool]  # of the metric
    # Words for the command's help, one phrase each.
    summary: ClassVar[str]  # the model and its data: "a small CNN on Fashion-MNIST"
    data_folder: ClassVar[str]  # what --data-dir holds: "Fashion-MNIST IDX folder"
    eval_split: ClassVar[str]  # the split evaluations read: "test"
    optimizer: ClassVar[str]  # "SGD"

    def better(self, metric: float, target: float) -> bool:
        """Whether ``metric`` reaches ``target``."""
        return metric >= target if self.higher_is_better else metric <= target

    def near(self, target: float, margin: float) -> float:
        """The metric ``margin`` short of ``target``."""
        return target - margin if self.higher_is_better else target + margin

    def combine(self, total: float, examples: int) -> float:
        """The metric of a split from the sum of its parts' metric x examples."""
        return total / examples

    @abstractmethod
    def default_data_dir(self) -> Path:
        """Where the workload's Debian package installs its data."""

    @abstractmethod
    def eval_splits(self, cfg: RunSettings) -> EvalSplits:
        """The evaluation split of ``cfg.data_dir``, in memory."""

    @abstractmethod
    def in_memory(self, cfg: RunSettings) -> tuple[Dataset, str, str]:
        """``(training split, what it is, content digest)`` for the in-memory upstream."""

    @abstractmethod
    def transforms(self, cfg: RunSettings, *, sharded: bool) -> Transforms:
        """The loader's augmentation at ``cfg.where``; ``sharded``: examples come from shards."""

    @abstractmethod
    def write_shards(
        self, out: Path, data_dir: str | Path, *, examples: int | None, examples_per_shard: int,
        seq_len: int,
    ) -> dict[str, Any]:  # fmt: skip
        """Write the first ``examples`` (None: all) of the training split as shards in ``out``
        (:mod:`dataecho.app.sources.shards`); the manifest."""

    @abstractmethod
    def build_model(
        self, cfg: RunSettings, vocab_size: int | None
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """A fresh model (seeded by the caller) and its optimizer; ``vocab_size``: the data's
        token ids (None for data without a vocabulary)."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of one batch."""

    @abstractmethod
    def evaluate(self, model: torch.nn.Module, split: Split) -> tuple[float, float | None, float]:
        """``(metric, accuracy or None, loss)`` of ``model`` on ``split``."""

    @abstractmethod
    def example_bytes(self, cfg: RunSettings) -> int:
        """A generous size of one buffered training example, for checkpoint estimates."""

    @abstractmethod
    def measure_step_seconds(self, batch_size: int, steps: int, *, seq_len: int) -> float:
        """Median seconds of a training step on a synthetic batch, after warm-up."""

    @abstractmethod
    def describe_metric(self, value: float) -> str:
        """The metric in a log line, e.g. ``test acc 0.8512``."""


def digest(*tensors: torch.Tensor) -> str:
    """A short content hash of the tensors' bytes: same data, same checkpoint."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()[:16]
