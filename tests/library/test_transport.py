"""Worker -> training process transport: small batches arrive whole, as ordinary tensors."""

from __future__ import annotations

import collections
import pickle

import pytest
import torch

from dataecho import EchoingDataLoader
from dataecho.loader.transport import PIPE_LIMIT, from_wire, to_wire

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
