"""Worker -> training process transport: small batches arrive whole, as ordinary tensors."""

from __future__ import annotations

import collections
import math
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from dataecho import EchoingDataLoader
from dataecho.loader.transport import PIPE_LIMIT, WorkerCollate, from_wire, to_wire

Pair = collections.namedtuple("Pair", "x y")


def roundtrip(batch):
    return from_wire(pickle.loads(pickle.dumps(to_wire(batch))))


def test_round_trip_keeps_values_dtypes_and_structure():
    batch = {
        "image": torch.rand(4, 1, 3, 3),
        "label": torch.arange(4),
        "mask": torch.tensor([True, False, True, True]),
        "pair": Pair(torch.zeros(2, dtype=torch.int16), "text"),
        "list": [torch.ones(1, dtype=torch.float64), 7],
    }
    out = roundtrip(batch)
    assert out.keys() == batch.keys() and isinstance(out["pair"], Pair)
    for key in ("image", "label", "mask"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key])
    assert torch.equal(out["pair"].x, batch["pair"].x) and out["pair"].y == "text"
    assert torch.equal(out["list"][0], batch["list"][0]) and out["list"][1] == 7
    out["image"].add_(1)  # the receiver owns writable memory
    assert not torch.equal(out["image"], batch["image"])


def test_the_limit_decides_which_batches_are_piped():
    big, small = torch.arange(PIPE_LIMIT // 8 + 1), torch.arange(4)
    piped = to_wire((big, 1), limit=math.inf)
    assert not isinstance(piped[0], torch.Tensor) and torch.equal(from_wire(piped)[0], big)
    assert to_wire((small, 1), limit=0)[0] is small


def test_large_batches_and_special_tensors_stay_tensors():
    big = torch.zeros(PIPE_LIMIT // 4 + 1)
    assert to_wire((big, 1))[0] is big
    grad = torch.zeros(3, requires_grad=True)
    bf16 = torch.zeros(3, dtype=torch.bfloat16)
    wired = to_wire((grad, bf16))
    assert wired[0] is grad and wired[1] is bf16


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
@pytest.mark.parametrize(("width", "pin", "shared"), [(8, False, False), (40_000, False, True),
                                                     (8, True, True)])  # fmt: skip
def test_workers_pipe_small_batches_and_share_large_ones(width, pin, shared):
    data = [(torch.full((width,), float(i)), i) for i in range(8)]
    loader = EchoingDataLoader(
        data, batch_size=4, echo_factor=2, where="after_augment", num_workers=1, pin_memory=pin
    )
    batches = list(loader)
    assert [x.is_shared() for x, _ in batches] == [shared] * 4
    values = sorted(int(v) for x, _ in batches for v in x[:, 0])
    assert values == sorted(list(range(8)) * 2)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_worker_collate_builds_what_default_collate_builds():
    examples = [
        {"image": np.full((2, 2), i, np.uint8), "label": i, "score": i / 2, "name": f"n{i}",
         "pair": Pair(torch.full((3,), float(i)), torch.tensor(i))}
        for i in range(4)
    ]  # fmt: skip
    got, want = WorkerCollate(replaced=True, piped=True)(examples), default_collate(examples)
    assert got.keys() == want.keys() and got["name"] == want["name"]
    assert isinstance(got["pair"], Pair)
    for a, b in [(got[k], want[k]) for k in ("image", "label", "score")] + list(
        zip(got["pair"], want["pair"], strict=True)
    ):
        assert a.dtype == b.dtype and torch.equal(a, b)
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(RuntimeError, match="nested tensors"):  # torch's own message
        WorkerCollate(replaced=True, piped=True)([nested, nested])


class _SharedFlags(IterableDataset):
    """In a worker: whether each batch a WorkerCollate stacks is in shared memory."""

    def __init__(self, widths, **kwargs):
        self.widths, self.kwargs = widths, kwargs

    def __iter__(self):
        collate = WorkerCollate(**self.kwargs)
        yield [collate([torch.zeros(w)] * 4).is_shared() for w in self.widths]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        # Replaced by a batch_transform: never shared memory, whatever the size.
        (dict(replaced=True, piped=True), [False, False, False]),
        # Piped: plain while small; once one is too large for the pipe, the next ones are
        # stacked into shared memory, where they will cross.
        (dict(replaced=False, piped=True), [False, False, True]),
        # Nothing piped (pin_memory): as default_collate in a worker.
        (dict(replaced=False, piped=False), [True, True, True]),
    ],
)
def test_worker_collate_uses_shared_memory_only_for_batches_crossing_there(kwargs, want):
    big = PIPE_LIMIT // 16 + 1  # 4 float32 rows of it: over the pipe's limit
    loader = DataLoader(_SharedFlags([8, big, 8], **kwargs), batch_size=None, num_workers=1)
    assert next(iter(loader)) == want


@pytest.mark.timeout(60)
def test_a_worker_batch_that_a_batch_transform_replaces_is_stacked_in_plain_memory():
    data = [(torch.full((8,), float(i)), i) for i in range(8)]
    seen = lambda batch: (batch[0], torch.tensor(batch[0].is_shared()))  # noqa: E731
    loader = EchoingDataLoader(
        data, batch_size=4, echo_factor=2, where="before_augment", num_workers=1,
        batch_transform=seen,
    )  # fmt: skip
    batches = list(loader)
    assert len(batches) == 4 and not any(bool(shared) for _, shared in batches)
    values = sorted(int(v) for x, _ in batches for v in x[:, 0])
    assert values == sorted(list(range(8)) * 2)
