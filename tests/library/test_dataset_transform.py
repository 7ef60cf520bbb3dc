"""A dataset's own augmentation runs on each echoed copy (dataecho.loader.dataset_transform).

The datasets here are shaped as torchvision's are (a base class holding ``transform``,
``target_transform`` and the joint ``transforms``; a FakeData-like dataset of random images)
without importing torchvision, which the library never imports either.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import run_test_save_load_state
from torch.utils.data import Dataset, Subset

from dataecho import EchoingDataLoader
from dataecho.loader.dataset_transform import (
    DatasetTransformError,
    IdenticalCopiesWarning,
    find_transform,
)

N = 20
ECHO = 4
SIDE = 6
SHIFT = 1  # the most pixels random_shift_flip moves an image


class PairTransform:
    """Like torchvision's StandardTransform: the separate transforms as one joint callable."""

    def __init__(self, transform: Callable | None, target_transform: Callable | None) -> None:
        self.transform, self.target_transform = transform, target_transform

    def __call__(self, image: Any, target: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class VisionLike(Dataset):
    """Shaped like torchvision's VisionDataset: either a joint ``transforms`` or the separate
    ``transform`` / ``target_transform``, whose pair then becomes ``transforms``."""

    def __init__(
        self,
        transforms: Callable | None = None,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
    ) -> None:
        separate = transform is not None or target_transform is not None
        if transforms is not None and separate:
            raise ValueError("pass transforms, or transform / target_transform, not both")
        self.transform = transform
        self.target_transform = target_transform
        self.transforms = PairTransform(transform, target_transform) if separate else transforms


def raw_image(i: int) -> torch.Tensor:
    """Example i's image, the same every time (its own generator: no global RNG drawn)."""
    return torch.rand(1, SIDE, SIDE, generator=torch.Generator().manual_seed(1000 + i))


class RandomImages(VisionLike):
    """FakeData-like: example i is (a random image, the label i), passed through the separate
    transforms in ``__getitem__``, as FakeData and ImageFolder do."""

    def __init__(self, n: int = N, **transforms: Any) -> None:
        super().__init__(**transforms)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, target = raw_image(i), i
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class JointImages(RandomImages):
    """VOC-like: ``__getitem__`` applies the joint ``self.transforms(image, target)``."""

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, target = raw_image(i), i
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target


def random_shift_flip(image: torch.Tensor) -> torch.Tensor:
    """A random shift by up to SHIFT pixels and a random horizontal flip, drawn from torch's
    global RNG, as torchvision's transforms draw."""
    dy, dx = torch.randint(-SHIFT, SHIFT + 1, (2,)).tolist()
    image = torch.roll(image, (dy, dx), dims=(-2, -1))
    return image.flip(-1) if torch.rand(()) < 0.5 else image


def every_shift_flip(image: torch.Tensor) -> list[torch.Tensor]:
    """Every image random_shift_flip can make of ``image``."""
    shifts = range(-SHIFT, SHIFT + 1)
    rolled = [torch.roll(image, (dy, dx), dims=(-2, -1)) for dy in shifts for dx in shifts]
    return rolled + [r.flip(-1) for r in rolled]


def label_plus_100(target: int) -> int:
    return target + 100


def joint_shift_flip(image: torch.Tensor, target: int) -> tuple[torch.Tensor, int]:
    return random_shift_flip(image), target + 100


def copies_by_example(loader: EchoingDataLoader) -> dict[int, list[torch.Tensor]]:
    """The delivered images of each example, by label (label - 100 is the example)."""
    out: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
    for images, labels in loader:
        for image, label in zip(images, labels, strict=True):
            out[int(label) - 100].append(image)
    return out


def assert_augmented_per_copy(copies: dict[int, list[torch.Tensor]], n: int = N) -> None:
    """Each example came ECHO times, each copy augmented once (not zero times, not twice), and
    its copies are not all one image."""
    assert sorted(copies) == list(range(n))
    for i, images in copies.items():
        assert len(images) == ECHO
        possible = every_shift_flip(raw_image(i))
        for image in images:
            assert any(torch.equal(image, p) for p in possible), f"example {i}: not one shift"
        assert not all(torch.equal(images[0], c) for c in images[1:]), (
            f"example {i}: its {ECHO} copies are identical"
        )


def vision_loader(dataset: Dataset, num_workers: int = 0, **kwargs: Any) -> EchoingDataLoader:
    return EchoingDataLoader(
        dataset, batch_size=4, echo_factor=ECHO, seed=0, num_workers=num_workers, **kwargs
    )


# --- torchvision-shaped datasets -------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_torchvision_style_transform_runs_on_each_copy(num_workers):
    ds = RandomImages(transform=random_shift_flip, target_transform=label_plus_100)
    before = dict(vars(ds))
    pair = ds.transforms
    loader = vision_loader(ds, num_workers, shuffle=True, shuffle_buffer=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdenticalCopiesWarning)
        assert_augmented_per_copy(copies_by_example(loader))
    assert loader.stats.fresh_examples == N and loader.stats.examples_out == ECHO * N
    # The user's dataset keeps its transforms: the loader read through a copy of it.
    assert vars(ds) == before and ds.transform is random_shift_flip and ds.transforms is pair
    image, label = ds[3]
    assert label == 103 and any(torch.equal(image, p) for p in every_shift_flip(raw_image(3)))


def test_a_joint_transforms_runs_on_each_copy_as_transforms_input_target():
    ds = JointImages(transforms=joint_shift_flip)
    assert_augmented_per_copy(copies_by_example(vision_loader(ds)))
    assert ds.transforms is joint_shift_flip


def test_a_transform_set_after_construction_is_the_one_run():
    # torchvision's pair (transforms) still holds the transform the dataset was made with;
    # FakeData and ImageFolder apply self.transform, so that is the one that must run.
    ds = RandomImages(transform=torch.zeros_like, target_transform=label_plus_100)
    ds.transform = random_shift_flip
    assert_augmented_per_copy(copies_by_example(vision_loader(ds)))


def test_a_subset_of_a_torchvision_style_dataset_is_augmented_per_copy():
    ds = RandomImages(transform=random_shift_flip, target_transform=label_plus_100)
    subset = Subset(ds, range(0, N, 2))
    copies = copies_by_example(vision_loader(subset))
    assert sorted(copies) == list(range(0, N, 2))
    for i, images in copies.items():
        assert not all(torch.equal(images[0], c) for c in images[1:]), f"example {i}"
    assert subset.dataset is ds and ds.transform is random_shift_flip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_lifting_a_dataset_transform_resumes_exactly(num_workers):
    # In the main process, at every position; with workers (started again for every epoch
    # each resume runs), at a few: mid-epoch, in the second worker's share, after the end.
    n = 8 if num_workers == 0 else 4

    def make() -> EchoingDataLoader:
        ds = RandomImages(n, transform=random_shift_flip, target_transform=label_plus_100)
        return vision_loader(ds, num_workers, shuffle=True, shuffle_buffer=6)

    recorded = run_test_save_load_state(
        make,
        positions=None if num_workers == 0 else [1, 3, -1],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        end_may_start_next_epoch=True,
    )
    assert [len(epoch) for epoch in recorded] == [len(make())] * 3
    copies = collections.defaultdict(list)
    for images, labels in recorded[0]:
        for image, label in zip(images, labels, strict=True):
            copies[int(label) - 100].append(image)
    assert_augmented_per_copy(copies, n)


def test_a_given_transform_runs_per_copy_and_the_dataset_s_own_once_per_read():
    calls = collections.Counter()

    def counted(name: str, fn: Callable) -> Callable:
        def call(x: Any) -> Any:
            calls[name] += 1
            return fn(x)

        return call

    ds = RandomImages(transform=counted("dataset", lambda x: x + 10))
    loader = vision_loader(ds, transform=counted("loader", lambda s: (s[0] * 2, s[1] + 100)))
    copies = copies_by_example(loader)
    assert calls == {"dataset": N, "loader": ECHO * N}
    for i, images in copies.items():  # the dataset's transform first, then the loader's
        assert all(torch.equal(image, (raw_image(i) + 10) * 2) for image in images)


def test_a_target_transform_on_samples_that_are_not_pairs_is_a_clear_error():
    class Triples(RandomImages):
        def __getitem__(self, i: int) -> tuple[Any, int, str]:
            return raw_image(i), i, "meta"

    loader = vision_loader(Triples(transform=random_shift_flip, target_transform=label_plus_100))
    with pytest.raises(DatasetTransformError, match=r"Triples.target_transform takes \(input, "
                       r"target\).*returned a tuple \(3 items\).*transform="):  # fmt: skip
        next(iter(loader))


def test_a_joint_transforms_beside_separate_ones_is_a_clear_error():
    ds = RandomImages(transform=random_shift_flip)
    ds.transforms = joint_shift_flip
    with pytest.raises(DatasetTransformError, match="cannot tell which one its __getitem__"):
        next(iter(vision_loader(ds)))


def test_nothing_is_lifted_where_the_options_say_so():
    ds = RandomImages(transform=random_shift_flip, target_transform=label_plus_100)
    # after_augment: the copies are the dataset's item, identical by request.
    for copies in copies_by_example(vision_loader(ds, where="after_augment")).values():
        assert all(torch.equal(copies[0], c) for c in copies[1:])
    # No echoing: the dataset is read as it is, each example once.
    copies = copies_by_example(EchoingDataLoader(ds, batch_size=4, seed=0))
    assert {len(c) for c in copies.values()} == {1}


# --- the warning for copies the loader cannot augment apart ----------------------------------


class Opaque(Dataset):
    """A dataset whose augmentation (if any) the loader cannot see: here, none at all."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


class ThroughAProperty(Opaque):
    """A transform behind a property: no copy can switch it off without the user's object."""

    @property
    def transform(self) -> Callable:
        return random_shift_flip


def identical_copies_warnings(make: Callable[[], EchoingDataLoader], epochs: int = 2) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make()
        for _ in range(epochs):
            list(loader)
    return sum(issubclass(w.category, IdenticalCopiesWarning) for w in caught)


@pytest.mark.parametrize("dataset", [Opaque, ThroughAProperty])
@pytest.mark.parametrize("echo_factor", [2, "auto"])
def test_identical_copies_warn_once_naming_the_fix(dataset, echo_factor):
    loader = EchoingDataLoader(dataset(), batch_size=4, echo_factor=echo_factor, seed=0)
    with pytest.warns(IdenticalCopiesWarning) as record:
        list(loader)
    message = str(record[0].message)
    assert record[0].filename == __file__  # pointed at the caller's loop
    for words in ("copies of each example are identical", dataset.__name__, "transform=",
                  "where='after_augment'"):  # fmt: skip
        assert words in message
    assert identical_copies_warnings(
        lambda: EchoingDataLoader(dataset(), batch_size=4, echo_factor=echo_factor, seed=0)
    ) == 1  # fmt: skip


@pytest.mark.parametrize(
    "kwargs",
    [
        {"where": "after_augment"},
        {"transform": lambda s: s},
        {"batch_transform": lambda b: b},
        {"echo_factor": 1},
        {"where": "batch"},
    ],
    ids=["after_augment", "transform", "batch_transform", "no echo", "batch"],
)
def test_no_warning_where_copies_are_meant_to_be_identical_or_augmented(kwargs):
    def make() -> EchoingDataLoader:
        return EchoingDataLoader(Opaque(), batch_size=4, seed=0, **{"echo_factor": 2, **kwargs})

    assert identical_copies_warnings(make) == 0


def test_no_warning_for_a_dataset_whose_transform_is_lifted():
    ds = RandomImages(transform=random_shift_flip)
    assert identical_copies_warnings(lambda: vision_loader(ds)) == 0


def test_what_is_found_in_a_dataset():
    assert find_transform(Opaque()) is None
    assert find_transform(ThroughAProperty()) is None
    assert find_transform(RandomImages()) is None  # every transform None: nothing to run
    lifted = find_transform(RandomImages(transform=random_shift_flip))
    raw = lifted.read_raw()
    assert type(raw) is RandomImages and raw.transform is None and raw.transforms is None
    assert torch.equal(raw[2][0], raw_image(2))
    stateful = RandomImages(transform=random_shift_flip)
    stateful.state_dict, stateful.load_state_dict = dict, lambda state: None
    assert find_transform(stateful) is None  # its copy would keep its state apart
