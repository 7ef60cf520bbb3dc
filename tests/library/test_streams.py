"""What every stream shares (dataecho/loader/streams, the loader's reading of iterable
datasets): which library a dataset is, a fractional factor over a stream without a length, a
dataset's own state between epochs, and the user's own loader as the upstream of batch echo.
Each library's own tests: test_streams_mosaic.py, _litdata, _webdataset, _hf, _ranks."""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import torch_roundtrip
from streams_data import check_resume
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho import DataechoTypeError, DataechoValueError, EchoingDataLoader
from dataecho.loader.streams import REGISTRY, find_stream

# torchdata's StatefulDataLoader, the user's loader here, says this of a torch call it makes.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


class Stream(IterableDataset):
    """``n`` ids without a length, split over the DataLoader's workers by itself."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        return iter(range(worker, self.n, workers))


def test_each_library_is_found_by_its_datasets_module_and_a_subclass_too():
    import datasets
    import webdataset as wds

    hf = datasets.IterableDataset.from_generator(lambda: iter([{"id": 1}]))
    assert find_stream(hf).NAME == "hf"
    assert find_stream(wds.WebDataset(["a.tar"], shardshuffle=False)).NAME == "webdataset"
    assert find_stream(Stream(4)) is None and find_stream(list(range(4))) is None
    subclass = type("Mine", (datasets.IterableDataset,), {})
    assert REGISTRY["hf"].matches(subclass.__new__(subclass))
    assert set(REGISTRY) == {"mosaic", "litdata", "webdataset", "hf"}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fractional_factor_over_a_stream_gives_the_same_copies_every_epoch(workers):
    # 96 ids, no len: 2.5 gives 48 third copies each epoch (24 per worker of 48), not a count
    # that varies from epoch to epoch.
    loader = EchoingDataLoader(Stream(96), batch_size=8, echo_factor=2.5, seed=0,
                               num_workers=workers, where="after_augment")  # fmt: skip
    for _ in range(3):
        counts = collections.Counter(i for b in loader for i in b.tolist())
        assert set(counts) == set(range(96)) and sum(counts.values()) == 240


def test_a_fractional_factor_over_a_streams_batches_gives_the_same_copies_every_epoch():
    # 12 fresh batches of a stream without len at 2.5: 6 of them get a third copy, each epoch.
    loader = EchoingDataLoader(Stream(96), batch_size=8, echo_factor=2.5, seed=0, where="batch")
    for _ in range(3):
        batches = collections.Counter(tuple(b.tolist()) for b in loader)
        assert len(batches) == 12 and sorted(batches.values()) == [2] * 6 + [3] * 6


def bursts():
    """Two batches' worth at once, then nothing for a while: a stream's next shard downloading."""
    import time

    for i in range(16):
        yield {"id": i}
    time.sleep(0.5)
    for i in range(16, 24):
        yield {"id": i}


def test_auto_over_a_streams_batches_fills_a_gap_from_a_shards_worth():
    # Over a stream "auto" at the batch level may reuse the last 8 batches by default, not only
    # the latest: both batches of the burst get their 4 copies while the next one is on its way.
    import datasets

    loader = EchoingDataLoader(datasets.IterableDataset.from_generator(bursts), batch_size=8,
                               echo_factor="auto", where="batch", seed=0)  # fmt: skip
    copies = collections.Counter(int(b["id"][0]) for b in loader)
    assert copies[0] == copies[8] == 4 and set(copies) == {0, 8, 16}
    assert loader.stats.fresh_examples == 24


class Counter(IterableDataset):
    """An epoch counter of its own, advanced when a pass ends (its whole state)."""

    def __init__(self) -> None:
        self.epoch = 0

    def __iter__(self):
        yield from (self.epoch * 100 + i for i in range(6))
        self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]


@pytest.mark.parametrize("make", ["dataecho", "torchdata"])
def test_a_datasets_own_state_after_an_epoch_carries_to_the_next(make):
    # As torchdata's StatefulDataLoader: a state taken after a whole epoch, loaded into a new
    # loader, goes on with epoch 1's items.
    def loader():
        if make == "torchdata":
            return StatefulDataLoader(Counter(), batch_size=3)
        return EchoingDataLoader(Counter(), batch_size=3, echo_factor=2, seed=0,
                                 where="after_augment", shuffle_buffer=0)  # fmt: skip

    first = loader()
    assert [i for b in first for i in b.tolist()][:: 2 if make == "dataecho" else 1] == list(
        range(6)
    )
    resumed = loader()
    resumed.load_state_dict(torch_roundtrip(first.state_dict()))
    assert sorted(set(i for b in resumed for i in b.tolist())) == list(range(100, 106))


def users_loader() -> StatefulDataLoader:
    return StatefulDataLoader(list(range(40)), batch_size=4, shuffle=True, num_workers=1,
                              generator=torch.Generator().manual_seed(0))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("where", ["batch", "device"])
def test_the_users_stateful_dataloader_is_the_upstream_with_one_exact_state(where):
    def make():
        return EchoingDataLoader(users_loader(), echo_factor=2.5, where=where, seed=0,
                                 echo_device="cpu" if where == "device" else None)  # fmt: skip

    loader = make()
    assert len(loader) == 25  # its 10 batches, 5 of them a third time
    counts = collections.Counter(i for b in loader for i in b.tolist())
    assert set(counts) == set(range(40)) and sum(counts.values()) == 100
    assert loader.stats.fresh_examples == 40
    check_resume(make, positions=[0, 6, 25], batches=25)


def test_a_loader_upstream_is_refused_where_it_cannot_be_echoed():
    with pytest.raises(DataechoValueError, match=r'where="batch"'):
        EchoingDataLoader(users_loader(), echo_factor=2)  # before_augment by default
    with pytest.raises(DataechoValueError, match="num_workers=2 .*set the workers on your"):
        EchoingDataLoader(users_loader(), echo_factor=2, where="batch", num_workers=2)


def test_a_plain_dataloader_upstream_echoes_but_its_state_names_the_fix():
    loader = EchoingDataLoader(DataLoader(list(range(8)), batch_size=4), echo_factor=2,
                               where="batch", seed=0)  # fmt: skip
    assert len([b for b in loader]) == 4
    it = iter(loader)
    next(it)
    with pytest.raises(DataechoTypeError, match="StatefulDataLoader"):
        loader.state_dict()
