"""dataecho with the libraries it is used among: Hugging Face ``datasets`` (map-style and
iterable) through ``EchoingDataLoader``, ``on_input`` transforms on dict and tuple samples, and
the echo-family stages composed with ``torchdata.nodes`` and a torch ``DataLoader``.

Everything is built in memory (or in a cache under ``tmp_path``), offline."""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from conftest import assert_same_item, assert_same_stream, run_test_save_load_state, torch_roundtrip
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate
from torchdata.nodes import (
    Batcher,
    IterableWrapper,
    Loader,
    Mapper,
    ParallelMapper,
    Prefetcher,
    SamplerWrapper,
)

import dataecho
from dataecho import EchoingDataLoader
from dataecho.loader.dataset_transform import find_transform
from dataecho.transforms import on_input

if TYPE_CHECKING:
    import datasets

N = 30  # rows of every Hugging Face dataset here
BATCH = 4


@pytest.fixture(autouse=True)
def hf_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No network, and the datasets cache under ``tmp_path`` (nothing in the home folder)."""
    # datasets (with pandas and pyarrow) is imported by the tests that use it, not at collection
    # in every test process.
    import datasets

    cache = tmp_path / "hf-datasets-cache"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    # `datasets` reads these variables once, when it is imported: set what it read, too.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def rows(n: int = N) -> datasets.Dataset:
    """Row i: {"id": i, "x": [i, i + 0.5], "label": i % 3}, as torch tensors."""
    import datasets

    table = {
        "id": list(range(n)),
        "x": [[float(i), i + 0.5] for i in range(n)],
        "label": [i % 3 for i in range(n)],
    }
    return datasets.Dataset.from_dict(table).with_format("torch")


def stream(n: int = N) -> datasets.IterableDataset:
    """The same rows as an iterable dataset of 2 shards (split over DataLoader workers)."""
    return rows(n).to_iterable_dataset(num_shards=2)


def ids_of(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def jitter(x: torch.Tensor) -> torch.Tensor:
    """A random augmentation drawing from torch's global RNG, as torchvision's do."""
    return x + torch.rand(x.shape)


def check_rows(batch: dict[str, torch.Tensor]) -> None:
    """A collated batch of rows: a dict of tensors whose rows are the dataset's."""
    assert isinstance(batch, dict) and list(batch) == ["id", "x", "label"]
    ids = batch["id"]
    assert ids.dtype == torch.int64 and batch["label"].dtype == torch.int64
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (len(ids), 2)
    assert torch.equal(batch["x"], torch.stack([ids.float(), ids + 0.5], dim=1))
    assert torch.equal(batch["label"], ids % 3)


# --- a map-style Hugging Face Dataset -------------------------------------------------------


def map_loader(num_workers: int) -> EchoingDataLoader:
    return EchoingDataLoader(
        rows(),
        batch_size=BATCH,
        echo_factor=2,
        where="after_augment",
        shuffle=True,
        seed=5,
        num_workers=num_workers,
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_style_hf_dataset_delivers_every_row_twice_an_epoch(num_workers):
    loader = map_loader(num_workers)
    orders = []
    for epoch in range(2):
        expected = len(loader)
        batches = list(loader)
        assert len(batches) == expected
        for batch in batches:
            check_rows(batch)
        ids = ids_of(batches)
        assert collections.Counter(ids) == {i: 2 for i in range(N)}
        assert loader.stats.fresh_examples == N * (epoch + 1)
        assert loader.stats.examples_out == 2 * N * (epoch + 1)
        orders.append(ids)
    assert orders[0] != orders[1]  # shuffle=True: a new order each epoch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_style_hf_dataset_resumes_exactly(num_workers):
    recorded = run_test_save_load_state(
        lambda: map_loader(num_workers),
        positions=[0, 1, 6, 15, -1] if num_workers == 0 else [5, -1],  # -1: after the end
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        end_may_start_next_epoch=True,  # a state saved after the epoch's end starts the next
    )
    assert [len(epoch) for epoch in recorded] == [len(map_loader(num_workers))] * 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_style_hf_dataset_resumed_after_k_batches_matches_an_uninterrupted_run(
    num_workers,
):
    want = list(map_loader(num_workers))
    loader = map_loader(num_workers)
    it = iter(loader)
    head = list(itertools.islice(it, 5))
    state = torch_roundtrip(loader.state_dict())
    del it
    resumed = map_loader(num_workers)
    resumed.load_state_dict(state)
    assert_same_stream(head + list(resumed), want, "head + rest")
    assert resumed.stats.fresh_examples == N and resumed.stats.examples_out == 2 * N


# --- an iterable Hugging Face dataset -------------------------------------------------------


def stream_loader(ds: datasets.IterableDataset, num_workers: int) -> EchoingDataLoader:
    return EchoingDataLoader(
        ds, batch_size=BATCH, echo_factor=2, where="after_augment", num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_hf_dataset_delivers_every_row_twice_an_epoch(num_workers):
    ds = stream()
    loader = stream_loader(ds, num_workers)
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = list(loader)
        for batch in batches:
            check_rows(batch)
        assert collections.Counter(ids_of(batches)) == {i: 2 for i in range(N)}
        assert loader.stats.fresh_examples == N * (epoch + 1)
        assert loader.stats.examples_out == 2 * N * (epoch + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", [0, 3, 8, "end"])
def test_an_iterable_hf_dataset_resumes_mid_epoch_without_loss(num_workers, k):
    # The HF dataset keeps its own position (state_dict / load_state_dict); it applies a loaded
    # position to every iteration of the epoch it was saved in, so a training loop calls
    # set_epoch(epoch) each epoch, as HF asks.
    ds = stream()
    loader = stream_loader(ds, num_workers)
    ds.set_epoch(0)
    it = iter(loader)
    head = ids_of(it) if k == "end" else ids_of(itertools.islice(it, k))
    state = torch_roundtrip(loader.state_dict())
    del it
    ds = stream()
    resumed = stream_loader(ds, num_workers)
    resumed.load_state_dict(state)
    # The epoch the next iter() runs: the saved one mid-epoch; the one after it when the state
    # was saved between epochs (before the first next(), no epoch had started).
    start = resumed.epoch + (k in (0, "end"))
    epochs = []
    for epoch in range(start, 2):
        ds.set_epoch(epoch)
        epochs.append(ids_of(resumed))
    if k != "end":
        epochs[0] = head + epochs[0]
    else:
        assert collections.Counter(head) == {i: 2 for i in range(N)}
    assert len(epochs) == 2 - (k == "end")
    for ids in epochs:
        assert collections.Counter(ids) == {i: 2 for i in range(N)}
    assert resumed.stats.fresh_examples == 2 * N  # each row read once an epoch
    assert resumed.stats.examples_out == 4 * N


# --- a Hugging Face dataset's own transform (set_transform / with_transform), per copy ------


def raw_rows(n: int = N) -> datasets.Dataset:
    """The rows of :func:`rows` as python objects (no format)."""
    import datasets

    return datasets.Dataset.from_dict(rows(n).with_format(None)[:])


def jitter_rows(batch: dict[str, list]) -> dict[str, torch.Tensor]:
    """A custom-format augmentation: a batch of python rows to tensors, ``x`` jittered."""
    out = {name: torch.tensor(values) for name, values in batch.items()}
    if "x" in out:
        out["x"] = out["x"] + torch.rand(out["x"].shape)
    return out


def doubled_x(batch: dict[str, list]) -> dict[str, Any]:
    """A deterministic custom-format transform: ``x`` doubled into a tensor, the rest kept."""
    return {name: torch.tensor(v) * 2 if name == "x" else v for name, v in batch.items()}


def with_own_transform(how: str, fn: Callable, n: int = N, **kwargs: Any) -> datasets.Dataset:
    if how == "with_transform":
        return raw_rows(n).with_transform(fn, **kwargs)
    table = raw_rows(n)
    table.set_transform(fn, **kwargs)
    return table


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("how", ["with_transform", "set_transform"])
def test_a_hf_dataset_s_own_transform_runs_on_each_copy(how, num_workers):
    table = with_own_transform(how, jitter_rows)
    before = table.format
    loader = EchoingDataLoader(
        table, batch_size=BATCH, echo_factor=4, shuffle=True, shuffle_buffer=8, seed=1,
        num_workers=num_workers,
    )  # fmt: skip
    copies = collections.defaultdict(list)
    for batch in loader:
        for i, x, y in zip(batch["id"], batch["x"], batch["label"], strict=True):
            copies[int(i)].append(x)
            assert int(y) == int(i) % 3
    assert sorted(copies) == list(range(N))
    for i, xs in copies.items():
        assert len(xs) == 4
        base = torch.tensor([i, i + 0.5])
        for x in xs:
            assert torch.all((x >= base) & (x < base + 1)), f"row {i}: jittered once, not twice"
        assert not all(torch.equal(xs[0], x) for x in xs[1:]), f"row {i}: identical copies"
    assert loader.stats.fresh_examples == N and loader.stats.examples_out == 4 * N
    assert table.format == before and table.format["format_kwargs"]["transform"] is jitter_rows


@pytest.mark.parametrize(
    ("columns", "output_all_columns"),
    [(None, False), (["x", "id"], False), (["x"], True)],
)
def test_the_lifted_hf_transform_gives_what_indexing_the_dataset_gives(columns, output_all_columns):
    table = raw_rows().with_transform(
        doubled_x, columns=columns, output_all_columns=output_all_columns
    )
    lifted = find_transform(table)
    raw = lifted.read_raw()
    assert raw.format["type"] is None and table.format["type"] == "custom"
    for i in range(N):
        assert_same_item(lifted.per_copy(raw[i]), table[i], f"row {i}")
    # Through the loader, copies adjacent (no shuffling): each row's copies are its table[i].
    # Without a shuffle buffer: each row's two copies side by side.
    loader = EchoingDataLoader(table, batch_size=BATCH, echo_factor=2, seed=0, shuffle_buffer=0)
    ids = [i for i in range(N) for _ in range(2)]
    want = [default_collate([table[i] for i in ids[k : k + BATCH]]) for k in range(0, 2 * N, 4)]
    assert_same_stream(list(loader), want, "echoed rows")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_lifting_a_hf_transform_resumes_exactly(num_workers):
    n = 8 if num_workers == 0 else 4

    def make() -> EchoingDataLoader:
        return EchoingDataLoader(
            with_own_transform("with_transform", jitter_rows, n=n), batch_size=BATCH,
            echo_factor=4, shuffle=True, shuffle_buffer=6, seed=3, num_workers=num_workers,
        )  # fmt: skip

    recorded = run_test_save_load_state(
        make,
        positions=[0, 1, 5, -1] if num_workers == 0 else [1, -1],  # -1: after the end
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        end_may_start_next_epoch=True,
    )
    assert [len(epoch) for epoch in recorded] == [len(make())] * 3


# --- transforms on one field of a sample ----------------------------------------------------


def copies_by_id(loader) -> dict[int, list[tuple[torch.Tensor, int]]]:
    """Delivered (x, label) copies of each row, by the row's id."""
    out: dict[int, list[tuple[torch.Tensor, int]]] = collections.defaultdict(list)
    for batch in loader:
        for i, x, y in zip(batch["id"], batch["x"], batch["label"], strict=True):
            out[int(i)].append((x, int(y)))
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("where", ["before_augment", "after_augment"])
def test_on_input_augments_one_field_of_a_dict_sample_per_copy(where, num_workers):
    def make() -> EchoingDataLoader:
        return EchoingDataLoader(
            rows(), batch_size=BATCH, echo_factor=2, where=where, shuffle=True, seed=2,
            transform=on_input(jitter, key="x"), shuffle_buffer=8, num_workers=num_workers,
        )  # fmt: skip

    copies = copies_by_id(make())
    assert sorted(copies) == list(range(N))
    for i, ((x0, y0), (x1, y1)) in copies.items():
        assert y0 == y1 == i % 3  # the other fields pass unchanged
        base = torch.tensor([i, i + 0.5])
        for x in (x0, x1):
            assert torch.all((x >= base) & (x < base + 1))  # jittered once, not twice
        if where == "before_augment":
            assert not torch.equal(x0, x1), f"row {i}: its copies got the same augmentation"
        else:
            assert torch.equal(x0, x1)
    again = copies_by_id(make())  # seeded by the pipeline seed: the same augmentations again
    for i, got in again.items():
        assert_same_stream([x for x, _ in got], [x for x, _ in copies[i]], f"row {i} again")


class ImagesAndLabels(Dataset):
    """A torchvision-style view of an HF dataset: sample i is (image, label)."""

    def __init__(self, table: datasets.Dataset) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.table[i]
        return row["image"], row["label"]


def images(n: int = N):
    for i in range(n):
        yield {"image": [[float(i)] * 4 for _ in range(4)], "label": i}


def test_on_input_augments_the_image_of_an_image_label_tuple_per_copy(hf_offline):
    import datasets

    table = datasets.Dataset.from_generator(images).with_format("torch")
    assert all(Path(f["filename"]).is_relative_to(hf_offline) for f in table.cache_files)
    loader = EchoingDataLoader(
        ImagesAndLabels(table), batch_size=BATCH, echo_factor=2, where="before_augment",
        transform=on_input(jitter), seed=4, shuffle=True,
    )  # fmt: skip
    copies = collections.defaultdict(list)
    for xs, ys in loader:
        assert xs.shape[1:] == (4, 4) and xs.dtype == torch.float32
        for x, y in zip(xs, ys, strict=True):
            copies[int(y)].append(x)
    assert sorted(copies) == list(range(N)) and {len(c) for c in copies.values()} == {2}
    for label, (x0, x1) in copies.items():
        assert torch.all((x0 >= label) & (x0 < label + 1)) and torch.all(x1 >= label)
        assert not torch.equal(x0, x1), f"image {label}: its copies got the same augmentation"
    assert loader.stats.fresh_examples == N and loader.stats.examples_out == 2 * N


# --- composition with torchdata.nodes -------------------------------------------------------


def square(i: int) -> int:
    return i * i


def squares_loader() -> Loader:
    source = Mapper(IterableWrapper(range(20)), square)
    return Loader(dataecho.shuffle(dataecho.echo(source, 2, seed=0), 8, seed=1))


def test_a_loader_over_echo_and_shuffle_of_torchdata_nodes_runs_its_epochs():
    loader = squares_loader()
    epochs = [list(loader) for _ in range(2)]
    for items in epochs:
        assert sorted(items) == sorted([i * i for i in range(20)] * 2)
    assert epochs[0] != epochs[1]  # each epoch draws its own shuffle
    root = loader.root
    assert root.stats.examples_out == 80 and root.source.stats.fresh_examples == 40


def test_a_loader_over_echo_and_shuffle_of_torchdata_nodes_resumes_exactly():
    recorded = run_test_save_load_state(
        squares_loader,
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        end_may_start_next_epoch=True,
    )
    assert [len(epoch) for epoch in recorded] == [40] * 3


def doubled(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**row, "x": row["x"] * 2}


def sampled_pipeline() -> Loader:
    """Sampler -> HF rows -> echo -> ParallelMapper -> Batcher -> collate -> Prefetcher."""
    table = rows()
    sampler = DistributedSampler(table, num_replicas=1, rank=0, shuffle=True, seed=3)
    node = Mapper(SamplerWrapper(sampler), table.__getitem__)
    node = dataecho.echo(node, 2, seed=0)
    node = ParallelMapper(node, doubled, num_workers=2, method="thread")
    node = Mapper(Batcher(node, BATCH, drop_last=False), default_collate)
    return Loader(Prefetcher(node, prefetch_factor=2))


def test_an_echo_stage_between_a_sampler_and_a_batcher_runs_its_epochs():
    loader = sampled_pipeline()
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == math.ceil(2 * N / BATCH)
        for batch in batches:
            assert torch.equal(batch["x"][:, 0], batch["id"] * 2.0)
        epochs.append(ids_of(batches))
        assert collections.Counter(epochs[-1]) == {i: 2 for i in range(N)}
    assert epochs[0] != epochs[1]  # the sampler's set_epoch: a new order


@pytest.mark.timeout(120)
def test_an_echo_stage_between_a_sampler_and_a_batcher_resumes_exactly():
    recorded = run_test_save_load_state(
        sampled_pipeline,
        positions=[6, -1],  # -1: after the epoch's end
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        end_may_start_next_epoch=True,
    )
    assert [len(epoch) for epoch in recorded] == [math.ceil(2 * N / BATCH)] * 3


def test_echo_over_a_torchdata_batcher_echoes_whole_batches():
    node = dataecho.echo(Batcher(IterableWrapper(range(10)), 4, drop_last=False), 2, seed=0)
    assert node.stats.unit == "batches"
    assert list(node) == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2 + [[8, 9]] * 2
    assert node.stats.fresh_items == 3 and node.stats.items_out == 6


# --- a stage over a torch DataLoader --------------------------------------------------------


def test_echo_over_a_dataloader_of_hf_rows_repeats_its_batches_epoch_after_epoch():
    generator = torch.Generator().manual_seed(0)
    batches = DataLoader(rows(), batch_size=BATCH, shuffle=True, generator=generator)
    node = dataecho.echo(batches, 2)
    assert node.stats.unit == "batches"
    fresh = len(batches)  # 8 batches of the 30 rows
    orders = []
    for epoch in range(2):
        out = [batch for batch in node]
        assert len(out) == 2 * fresh
        for first, copy in zip(out[::2], out[1::2], strict=True):
            check_rows(first)
            assert_same_stream([copy], [first], "an echoed batch")
        ids = ids_of(out[::2])
        assert sorted(ids) == list(range(N))
        orders.append(ids)
        assert node.stats.fresh_items == fresh * (epoch + 1)
        assert node.stats.items_out == 2 * fresh * (epoch + 1)
    assert orders[0] != orders[1]  # the DataLoader reshuffles each epoch
