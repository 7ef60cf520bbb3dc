"""dataecho.transforms: on_input for (input, target) samples, and the loader's explained errors."""

from __future__ import annotations

import collections
import pickle
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch.utils.data import Dataset

from dataecho import EchoingDataLoader
from dataecho.errors import DataechoError
from dataecho.transforms import (
    GuardedTransform,
    OnInput,
    SampleTransformAttributeError,
    SampleTransformError,
    SampleTransformValueError,
    guard_transform,
    on_input,
)

Sample = namedtuple("Sample", ["image", "label"])


def input_only(x: torch.Tensor) -> torch.Tensor:
    """Behaves like a torchvision transform: tensors only, a TypeError on anything else."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Unexpected type {type(x)}")
    return x * 2


def needs_shape(x: torch.Tensor) -> torch.Tensor:
    return x.flip(0) if x.shape[0] > 0 else x  # a tuple has no .shape: AttributeError


def wrong_size(x: object) -> object:
    raise ValueError("expected a 3-channel image")


def whole_sample(sample: tuple) -> tuple:
    x, y = sample
    return x + 1, y


class Pairs(Dataset):
    """n samples (Tensor[1, 4] filled with i, label i), as a torchvision dataset gives."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((1, 4), float(i)), i


# --- on_input --------------------------------------------------------------------------------


def test_on_input_maps_the_input_and_keeps_the_sample_type() -> None:
    x = torch.ones(2)
    t = on_input(input_only)
    out = t((x, 3))
    assert type(out) is tuple and torch.equal(out[0], x * 2) and out[1] == 3
    out = t([x, 3, "meta", {"id": 7}])  # the rest passes on unchanged
    assert type(out) is list and torch.equal(out[0], x * 2) and out[1:] == [3, "meta", {"id": 7}]
    out = t(Sample(x, 5))
    assert type(out) is Sample and torch.equal(out.image, x * 2) and out.label == 5
    out = on_input(input_only, key=1)((3, x))  # the input at another position
    assert out[0] == 3 and torch.equal(out[1], x * 2)


def test_on_input_on_dict_samples_needs_the_key() -> None:
    x = torch.ones(2)
    out = on_input(input_only, key="image")(OrderedDict(image=x, label=4))
    assert type(out) is OrderedDict and list(out) == ["image", "label"]
    assert torch.equal(out["image"], x * 2) and out["label"] == 4
    with pytest.raises(TypeError, match=r"dict sample with keys \['label', 'image'\].*key='image'"):
        on_input(input_only)({"label": 4, "image": x})
    with pytest.raises(KeyError, match=r"key='img'.*\['image', 'label'\]"):
        on_input(input_only, key="img")({"image": x, "label": 4})


def test_on_input_never_changes_the_sample_itself() -> None:
    x = torch.ones(2)
    as_list, as_dict = [x, 1], {"image": x, "label": 1}
    on_input(input_only)(as_list)
    on_input(input_only, key="image")(as_dict)
    assert as_list[0] is x and as_dict["image"] is x
    assert torch.equal(x, torch.ones(2))


def test_on_input_errors_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"expects an \(input, target, \.\.\.\).*got Tensor.*"
                                        r"transform=input_only"):  # fmt: skip
        on_input(input_only)(torch.ones(2))
    with pytest.raises(IndexError, match=r"key=2.*2 items"):
        on_input(input_only, key=2)((torch.ones(2), 0))
    with pytest.raises(TypeError, match=r"key='image'.*position"):
        on_input(input_only, key="image")((torch.ones(2), 0))
    with pytest.raises(TypeError, match=r"callable transform, got 3"):
        on_input(3)  # type: ignore[arg-type]


def test_on_input_and_guard_are_picklable() -> None:
    for t in (on_input(input_only), on_input(input_only, key="image"),
              guard_transform(input_only), guard_transform(on_input(input_only))):  # fmt: skip
        back = pickle.loads(pickle.dumps(t))
        assert type(back) is type(t) and repr(back) == repr(t)
    back = pickle.loads(pickle.dumps(on_input(input_only)))
    assert torch.equal(back((torch.ones(2), 0))[0], torch.full((2,), 2.0))
    assert repr(on_input(input_only, key="image")) == "on_input(input_only, key='image')"
    assert isinstance(on_input(input_only), OnInput)


# --- guard_transform -------------------------------------------------------------------------


def test_guard_explains_a_transform_that_takes_the_input_alone() -> None:
    sample = (torch.zeros(3, 28, 28), 7)
    with pytest.raises(TypeError) as info:
        guard_transform(input_only)(sample)
    err = info.value
    assert isinstance(err, SampleTransformError)
    msg = str(err)
    assert "transform input_only raised TypeError (Unexpected type <class 'tuple'>)" in msg
    assert "sample of type tuple: (Tensor[3, 28, 28] float32, int)" in msg
    assert msg.endswith("transform=dataecho.transforms.on_input(input_only)")
    # The original stays, with its traceback down to the frame that raised it.
    assert type(err.__cause__) is TypeError and "Unexpected type" in str(err.__cause__)
    assert err.__cause__.__traceback__ is not None
    frames = []
    tb = err.__cause__.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[-1] == "input_only"


def test_guard_names_the_key_for_dict_samples() -> None:
    sample = {"label": 1, "image": torch.zeros(1, 2), "extra": [1, 2]}
    with pytest.raises(TypeError) as info:
        guard_transform(input_only)(sample)
    msg = str(info.value)
    structure = "{'label': int, 'image': Tensor[1, 2] float32, 'extra': list of 2}"
    assert f"sample of type dict: {structure}" in msg
    assert msg.endswith("transform=dataecho.transforms.on_input(input_only, key='image')")


def test_guard_keeps_the_kind_of_a_value_or_attribute_error() -> None:
    sample = [torch.zeros(2), 0]
    with pytest.raises(ValueError, match=r"expected a 3-channel image.*sample of type list"):
        guard_transform(wrong_size)(sample)
    with pytest.raises(AttributeError) as info:
        guard_transform(needs_shape)(sample)
    assert isinstance(info.value, SampleTransformError)  # a TypeError too
    assert type(info.value.__cause__) is AttributeError
    assert "on_input(needs_shape)" in str(info.value)


@pytest.mark.parametrize(
    ("transform", "kind", "builtin"),
    [(input_only, SampleTransformError, TypeError),
     (wrong_size, SampleTransformValueError, ValueError),
     (needs_shape, SampleTransformAttributeError, AttributeError)],
)  # fmt: skip
def test_sample_transform_errors_are_dataecho_errors_that_pickle(
    transform: object, kind: type[SampleTransformError], builtin: type[Exception]
) -> None:
    """A worker process sends its exception pickled: the class, its bases and message survive."""
    with pytest.raises(DataechoError) as info:
        guard_transform(transform)([torch.zeros(2), 0])
    assert type(info.value) is kind
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is kind and isinstance(back, builtin) and isinstance(back, TypeError)
    assert str(back) == str(info.value) and "on_input(" in str(back)


def test_guard_passes_other_errors_and_results_unchanged() -> None:
    x = torch.ones(2)
    assert torch.equal(guard_transform(input_only)(x), x * 2)
    assert guard_transform(whole_sample)((x, 1))[1] == 1
    # A sample that is the input itself: the transform's own error, the same object.
    original = TypeError("mine")

    def fails(_):
        raise original

    with pytest.raises(TypeError) as info:
        guard_transform(fails)(x)
    assert info.value is original
    # Errors other than TypeError, ValueError and AttributeError are never rewritten.
    with pytest.raises(KeyError) as info:
        guard_transform(lambda s: s["missing"])({"image": x})
    assert type(info.value) is KeyError
    # on_input's errors are about the input itself (its structure is already taken apart).
    with pytest.raises(TypeError, match="Unexpected type") as info:
        guard_transform(on_input(input_only))(([1, 2], 0))
    assert type(info.value) is TypeError
    guarded = guard_transform(input_only)
    assert guard_transform(guarded) is guarded and isinstance(guarded, GuardedTransform)


def test_guard_applied_to_a_batch_gives_each_result_and_explains_the_sample_that_failed() -> None:
    """``apply`` (the batch path of where="before_augment") is ``[guarded(s) for s in samples]``."""
    xs = [torch.ones(2), torch.zeros(3)]
    assert all(torch.equal(a, b) for a, b in zip(guard_transform(input_only).apply(xs),
                                                 [x * 2 for x in xs], strict=True))  # fmt: skip
    assert guard_transform(input_only).apply([]) == []
    with pytest.raises(TypeError) as info:  # the second sample, not the first, is a tuple
        guard_transform(input_only).apply([torch.ones(2), (torch.zeros(3, 5), 7)])
    assert isinstance(info.value, SampleTransformError)
    assert "sample of type tuple: (Tensor[3, 5] float32, int)" in str(info.value)
    assert type(info.value.__cause__) is TypeError
    with pytest.raises(KeyError):  # passed on unchanged, as by a call
        guard_transform(lambda s: s["missing"]).apply([{"image": torch.ones(1)}])


# --- through the loader ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_with_on_input_transforms_the_input_only(num_workers: int) -> None:
    loader = EchoingDataLoader(Pairs(10), batch_size=4, echo_factor=2, num_workers=num_workers,
                               transform=on_input(input_only), seed=0)  # fmt: skip
    batches = list(loader)
    xs = torch.cat([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    assert collections.Counter(ys.tolist()) == {i: 2 for i in range(10)}
    assert torch.equal(xs, torch.full((1, 4), 2.0) * ys.reshape(-1, 1, 1).float())
    assert (loader.stats.fresh_examples, loader.stats.examples_out) == (10, 20)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_explains_an_unwrapped_input_transform_at_next(num_workers: int) -> None:
    loader = EchoingDataLoader(Pairs(10), batch_size=4, num_workers=num_workers,
                               transform=input_only, seed=0)  # fmt: skip
    it = iter(loader)
    with pytest.raises(TypeError) as info:
        next(it)
    err = info.value
    assert isinstance(err, SampleTransformError) and isinstance(err, DataechoError)
    msg = str(err)
    assert "Unexpected type <class 'tuple'>" in msg
    assert "(Tensor[1, 4] float32, int)" in msg
    assert "transform=dataecho.transforms.on_input(input_only)" in msg
    if num_workers == 0:
        assert type(err.__cause__) is TypeError
        assert str(err.__cause__) == "Unexpected type <class 'tuple'>"
    else:
        # From a worker process, torch sends the exception as text: the chained original
        # is in its traceback.
        assert "Original Traceback" in msg and "in input_only" in msg
        assert "The above exception was the direct cause of the following exception" in msg
    loader.close()


def test_loader_with_a_real_torchvision_transform() -> None:
    transforms = pytest.importorskip("torchvision.transforms")
    flip = transforms.RandomHorizontalFlip(p=1.0)
    images = [(torch.arange(4.0).reshape(1, 4) + i, i) for i in range(4)]
    with pytest.raises(TypeError, match=r"on_input\(RandomHorizontalFlip") as info:
        loader = EchoingDataLoader(images, batch_size=2, transform=flip, seed=0)
        next(iter(loader))
    assert isinstance(info.value.__cause__, TypeError)  # torchvision's own error
    batches = list(EchoingDataLoader(images, batch_size=2, transform=on_input(flip), seed=0))
    x, y = batches[0]
    assert torch.equal(x[1], images[1][0].flip(-1)) and y.tolist() == [0, 1]
