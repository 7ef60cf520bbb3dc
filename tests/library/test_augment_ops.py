"""``dataecho.augment``: batched per-sample augmentation, seeded and resumable from a generator."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F

import dataecho
from dataecho.app.workloads.image_augment import Augment
from dataecho.augment import AugmentError, AugmentTypeError, Compose, RandomResizedCrop, ShiftFlip
from dataecho.errors import DataechoError

OPS = {
    "shift_flip": lambda: ShiftFlip(pad=2, flip=True),
    "resized_crop": lambda: RandomResizedCrop(20),
    "compose": lambda: Compose([ShiftFlip(pad=3), RandomResizedCrop((24, 20), scale=(0.3, 1.0))]),
}


def images(n: int = 64, c: int = 1, h: int = 28, w: int = 28, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(seed))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def clone(generator: torch.Generator) -> torch.Generator:
    copy = torch.Generator(device=generator.device)
    copy.set_state(generator.get_state())
    return copy


def shifted_and_flipped(image: torch.Tensor, flipped: bool, dy: int, dx: int, pad: int):
    """The demo's augmentation for one image, written as pad, crop and flip."""
    h, w = image.shape[-2:]
    source = image.flip(-1) if flipped else image
    return F.pad(source, (pad, pad, pad, pad))[
        ..., pad + dy : pad + dy + h, pad + dx : pad + dx + w
    ]


# ShiftFlip is the demo's augmentation.


@pytest.mark.parametrize(("pad", "flip"), [(0, True), (1, False), (2, True), (4, True)])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 9, 13)])
def test_shift_flip_equals_the_demo_augment_pixel_for_pixel_for_the_same_draws(pad, flip, shape):
    batch = images(400, *shape)
    torch.manual_seed(7)  # the demo draws from the global generator, one randint per batch
    expected = Augment(pad=pad, flip=flip, mean=0.0, std=1.0)(batch)
    assert torch.equal(ShiftFlip(pad, flip)(batch, generator=seeded(7)), expected)
    quantised = (batch * 255).to(torch.uint8)
    torch.manual_seed(8)
    expected = Augment(pad=pad, flip=flip, mean=0.0, std=1.0)(quantised.float())
    assert torch.equal(ShiftFlip(pad, flip)(quantised, generator=seeded(8)).float(), expected)


def test_every_shift_flip_output_is_its_input_padded_cropped_and_flipped():
    op, batch = ShiftFlip(pad=3), images(600, 2, 10, 12)
    generator = seeded(3)
    draws = op.sample(len(batch), generator=clone(generator))
    out = op(batch, generator=generator)
    side = 2 * op.pad + 1
    for n, k in enumerate(draws.tolist()):
        flipped, dy, dx = k // side**2, k // side % side - op.pad, k % side - op.pad
        assert torch.equal(out[n], shifted_and_flipped(batch[n], bool(flipped), dy, dx, op.pad))
    # Every shift and flip is drawn, each about equally often (600 draws over 98 choices).
    counts = torch.bincount(draws, minlength=op.choices)
    assert len(counts) == op.choices == 98 and counts.min() >= 1 and counts.max() <= 20


# RandomResizedCrop is a bilinear resample of a box that fits.


def test_every_resized_crop_output_is_a_bilinear_resample_of_its_box():
    op, batch = RandomResizedCrop((16, 20)), images(200, 3, 28, 30)
    generator = seeded(4)
    boxes = op.sample(len(batch), 28, 30, generator=clone(generator))
    out = op(batch, generator=generator)
    assert out.shape == (200, 3, 16, 20)
    for n, (top, left, h, w) in enumerate(boxes.tolist()):
        assert 0 <= top and top + h <= 28 and 0 <= left and left + w <= 30
        box = batch[n : n + 1, :, top : top + h, left : left + w]
        expected = F.interpolate(box, size=(16, 20), mode="bilinear", align_corners=False)
        torch.testing.assert_close(out[n : n + 1], expected, atol=1e-5, rtol=0)


def test_resized_crop_boxes_have_the_drawn_area_and_aspect_ratio():
    op = RandomResizedCrop(8, scale=(0.25, 0.5), ratio=(0.5, 2.0))
    boxes = op.sample(2000, 100, 100, generator=seeded(5))
    top, left, h, w = boxes.T.double()
    # Rounding each side to whole pixels moves the area and ratio a little off their ranges.
    assert (h * w / 1e4).min() >= 0.24 and (h * w / 1e4).max() <= 0.51
    assert (w / h).min() >= 0.48 and (w / h).max() <= 2.05
    assert (top + h).max() <= 100 and (left + w).max() <= 100 and top.min() >= 0
    # The position is spread over all the places the box fits, not pinned to a corner.
    assert top.min() == 0 and (top + h).max() == 100 and left.std() > 10


def test_a_resized_crop_that_never_fits_falls_back_to_the_central_box():
    # Any box of the whole area at ratio >= 2 is wider than a 10x10 image.
    op = RandomResizedCrop(4, scale=(1.0, 1.0), ratio=(2.0, 3.0))
    boxes = op.sample(6, 10, 10, generator=seeded(0))
    assert boxes.tolist() == [[2, 0, 5, 10]] * 6


def test_a_uint8_resized_crop_is_the_rounded_float_one():
    batch = (images(32, 1, 28, 28) * 255).round().to(torch.uint8)
    out = RandomResizedCrop(12)(batch, generator=seeded(1))
    expected = RandomResizedCrop(12)(batch.float(), generator=seeded(1)).round()
    assert out.dtype == torch.uint8 and torch.equal(out.float(), expected)


# Seeded, resumable, and different for every sample.


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_same_seed_gives_the_same_batch_and_another_seed_another(name):
    op, batch = OPS[name](), images()
    first = op(batch, generator=seeded(11))
    assert torch.equal(op(batch, generator=seeded(11)), first)
    assert not torch.equal(op(batch, generator=seeded(12)), first)


@pytest.mark.parametrize("name", sorted(OPS))
def test_restoring_the_generator_state_mid_way_replays_the_same_outputs(name):
    op, batch = OPS[name](), images()
    generator = seeded(21)
    op(batch, generator=generator)
    saved = generator.get_state()  # what a checkpoint stores
    later = [op(batch, generator=generator) for _ in range(3)]
    resumed = torch.Generator()
    resumed.set_state(saved)
    assert all(torch.equal(op(batch, generator=resumed), want) for want in later)
    assert not torch.equal(later[0], later[1])  # each call draws anew


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_sample_of_a_batch_gets_its_own_parameters(name):
    one = images(1, 1, 28, 28)
    out = OPS[name]()(one.expand(64, -1, -1, -1), generator=seeded(2))
    distinct = torch.unique(out.reshape(64, -1), dim=0)
    assert len(distinct) > 32


def test_without_a_generator_the_ops_draw_from_torchs_default_one():
    op, batch = Compose([ShiftFlip(2), RandomResizedCrop(28)]), images()
    torch.manual_seed(3)
    first = op(batch)
    torch.manual_seed(3)
    assert torch.equal(op(batch), first)


def test_compose_runs_its_ops_in_order_on_one_generator():
    shift, crop, batch = ShiftFlip(2), RandomResizedCrop(14), images()
    generator = seeded(6)
    expected = crop(shift(batch, generator=generator), generator=generator)
    assert torch.equal(Compose([shift, crop])(batch, generator=seeded(6)), expected)


# Dtype, shape, memory and pairs.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.uint8])
@pytest.mark.parametrize("name", sorted(OPS))
def test_dtype_and_channels_are_kept_and_the_input_is_neither_changed_nor_shared(name, dtype):
    batch = (images(16, 3, 28, 28) * (255 if dtype == torch.uint8 else 1)).to(dtype)
    before = batch.clone()
    out = OPS[name]()(batch, generator=seeded(0))
    assert out.dtype == dtype and out.shape[:2] == (16, 3)
    if name == "shift_flip":
        assert out.shape == batch.shape
    assert torch.equal(batch, before)
    assert out.untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", sorted(OPS))
def test_an_empty_batch_gives_an_empty_batch(name):
    out = OPS[name]()(images(0, 3, 28, 28), generator=seeded(0))
    assert out.shape[:2] == (0, 3)


def test_a_pair_has_its_inputs_augmented_and_its_targets_passed_on_in_its_own_type():
    batch, targets = images(), torch.arange(64)
    expected = ShiftFlip(2)(batch, generator=seeded(9))
    as_tuple = ShiftFlip(2)((batch, targets), generator=seeded(9))
    as_list = ShiftFlip(2)([batch, targets], generator=seeded(9))
    Pair = namedtuple("Pair", "inputs targets")
    as_named = ShiftFlip(2)(Pair(batch, targets), generator=seeded(9))
    assert type(as_tuple) is tuple and type(as_list) is list and type(as_named) is Pair
    for pair in (as_tuple, as_list, as_named):
        assert len(pair) == 2 and torch.equal(pair[0], expected) and pair[1] is targets


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_ops_draw_there_and_apply_the_same_parameters_as_on_the_cpu():
    batch, device = images(), torch.device("cuda")
    for op in (ShiftFlip(2), RandomResizedCrop(20)):
        generator = torch.Generator(device=device).manual_seed(0)
        out = op(batch.to(device), generator=generator)
        assert out.device.type == "cuda"
        again = op(batch.to(device), generator=torch.Generator(device=device).manual_seed(0))
        assert torch.equal(out, again)
    shift = ShiftFlip(2)
    draws = shift.sample(
        len(batch), device=device, generator=torch.Generator(device).manual_seed(1)
    )
    assert torch.equal(shift.apply(batch.to(device), draws).cpu(), shift.apply(batch, draws.cpu()))
    crop = RandomResizedCrop(20)
    boxes = crop.sample(64, 28, 28, device=device)
    torch.testing.assert_close(
        crop.apply(batch.to(device), boxes).cpu(), crop.apply(batch, boxes.cpu()), atol=1e-5, rtol=0
    )


# Bad arguments.


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: ShiftFlip(pad=-1), AugmentError, "got -1; use pad=0"),
        (lambda: ShiftFlip(pad=1.5), AugmentTypeError, "got 1.5"),
        (lambda: ShiftFlip(flip="yes"), AugmentTypeError, "got 'yes'"),
        (lambda: RandomResizedCrop(0), AugmentError, "got 0; e.g. size=224"),
        (lambda: RandomResizedCrop((1, 2, 3)), AugmentTypeError, "got (1, 2, 3)"),
        (lambda: RandomResizedCrop(8, scale=(0.5, 0.1)), AugmentError, "low <= high <= 1"),
        (lambda: RandomResizedCrop(8, scale=(0.0, 1.0)), AugmentError, "got (0.0, 1.0)"),
        (lambda: RandomResizedCrop(8, scale=(0.5, 1.5)), AugmentError, "got (0.5, 1.5)"),
        (lambda: RandomResizedCrop(8, ratio=(0, 1)), AugmentError, "e.g. ratio=(3/4, 4/3)"),
        (lambda: RandomResizedCrop(8, ratio=1.0), AugmentTypeError, "(low, high) pair"),
        (lambda: RandomResizedCrop(8, attempts=0), AugmentError, "got 0"),
        (lambda: Compose("ab"), AugmentTypeError, "list of ops"),
        (lambda: Compose([ShiftFlip(), 3]), AugmentTypeError, "op 1 is 3"),
        (lambda: Compose([]), AugmentError, "at least one op, got \\[\\]"),
    ],
)
def test_a_bad_argument_names_the_value_and_the_fix(make, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        make()
    assert isinstance(caught.value, DataechoError)


@pytest.mark.parametrize(
    ("batch", "error", "words"),
    [
        (images()[0], AugmentError, r"got shape \(1, 28, 28\); add the missing axes"),
        (images().to(torch.int32), AugmentError, r"got torch.int32; convert with .float\(\)"),
        (images().numpy(), AugmentTypeError, "got ndarray"),
        ({"x": images()}, AugmentTypeError, "got dict"),
        (images(4, 1, 3, 3), AugmentError, "pad=4 shifts a whole"),
    ],
)
def test_a_batch_the_ops_cannot_take_is_a_clear_error(batch, error, words):
    with pytest.raises(error, match=words):
        ShiftFlip(pad=4)(batch, generator=seeded(0))


def test_a_generator_of_the_wrong_kind_is_a_clear_error():
    with pytest.raises(AugmentTypeError, match="torch.Generator or None, got int"):
        ShiftFlip()(images(), generator=0)
    with pytest.raises(AugmentError, match="generator is on cpu but the batch is on meta"):
        ShiftFlip()(images().to("meta"), generator=seeded(0))


def test_the_module_is_public_on_the_package():
    assert "augment" in dataecho.__all__ and dataecho.augment.ShiftFlip is ShiftFlip


# --- Normalize ------------------------------------------------------------------------------


def test_normalize_matches_the_host_side_normalisation_for_uint8_and_float():
    from dataecho.app.workloads.image_augment import (
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
        normalize,
    )

    images = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    op = dataecho.augment.Normalize(FASHION_MNIST_MEAN, FASHION_MNIST_STD)
    out = op(images)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, normalize(images))
    torch.testing.assert_close(op(images.float() / 255), normalize(images))
    labels = torch.arange(4)
    pair = op((images, labels))
    assert pair[1] is labels
    torch.testing.assert_close(pair[0], out)


def test_shift_flip_then_normalize_equals_the_demo_augmentation():
    from dataecho.app.workloads.image_augment import FASHION_MNIST_MEAN, FASHION_MNIST_STD, Augment

    images = torch.randint(0, 256, (16, 1, 28, 28), dtype=torch.uint8)
    device_side = dataecho.augment.Compose(
        [
            dataecho.augment.ShiftFlip(2),
            dataecho.augment.Normalize(FASHION_MNIST_MEAN, FASHION_MNIST_STD),
        ]
    )
    torch.manual_seed(5)
    host = Augment(pad=2)(images)
    out = device_side(images, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(out, host)


@pytest.mark.parametrize(("mean", "std", "message"), [(0.0, 0.0, "std must be"),
                                                      (float("nan"), 1.0, "mean must be")])  # fmt: skip
def test_normalize_refuses_bad_statistics(mean, std, message):
    with pytest.raises(ValueError, match=message):
        dataecho.augment.Normalize(mean, std)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.mark.parametrize(
    ("mean", "std"),
    [
        (IMAGENET_MEAN, IMAGENET_STD),
        (list(IMAGENET_MEAN), list(IMAGENET_STD)),
        (torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)),
        (IMAGENET_MEAN, 0.25),  # one of them per channel, the other for every channel
    ],
    ids=["tuples", "lists", "tensors", "mixed"],
)
def test_normalize_takes_one_mean_and_std_per_channel_as_torchvision_users_pass_them(mean, std):
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    op = dataecho.augment.Normalize(mean, std)
    m = torch.as_tensor(mean, dtype=torch.float64).expand(3).view(1, 3, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float64).expand(3).view(1, 3, 1, 1)
    want = ((images.double() / 255 - m) / s).float()  # torchvision's formula, per channel
    out = op(images)
    assert out.dtype == torch.float32 and out.shape == images.shape
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(op(images.float() / 255), want)  # floats are 0..1 already
    pair = op((images, torch.arange(4)))
    torch.testing.assert_close(pair[0], want)
    assert "Normalize(mean=(0.485, 0.456, 0.406)" in repr(op)


@pytest.mark.parametrize(
    ("mean", "std", "error", "message"),
    [
        ((0.5, 0.5), (0.2, 0.0), ValueError,
         r"std must be a finite number > 0, got 0.0 \(channel 1 of \(0.2, 0.0\)\)"),
        ((0.5, 0.5), torch.tensor([0.2, -1.0]), ValueError, r"std must be a finite number > 0, "
         r"got -1.0 \(channel 1 of tensor\(\[ 0.2000, -1.0000\]\)\)"),
        ((0.5, float("inf")), 0.2, ValueError, r"mean must be a finite number, got inf \(channel 1"),
        ((0.5, 0.5, 0.5), (0.2, 0.2), ValueError,
         r"mean and std give different channel counts \(3 and 2\)"),
        ((), 0.2, ValueError, r"mean must give at least one value, got \(\)"),
        (torch.zeros(3, 1), 0.2, ValueError, r"mean must be a number or one per channel \(a 1-D "
         r"tensor\), got a tensor of shape \(3, 1\)"),
        ("0.5", 0.2, TypeError, r"mean must be a finite number or a sequence of them \(one per "
         r"channel\), got '0.5' of type str"),
        ((0.5, "x"), (0.2, 0.2), TypeError, r"mean must be a finite number per channel, got 'x' "
         r"\(channel 1 of \(0.5, 'x'\)\) of type str"),
    ],
)  # fmt: skip
def test_per_channel_statistics_are_checked_with_the_channel_and_the_range(
    mean, std, error, message
):
    with pytest.raises(error, match=message):
        dataecho.augment.Normalize(mean, std)


def test_per_channel_statistics_must_match_the_batchs_channels_at_call_time():
    op = dataecho.augment.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    with pytest.raises(ValueError, match=r"has 3 values per channel, but the batch has 1 "
                       r"channel\(s\) \(shape \(2, 1, 4, 4\), \[N, C, H, W\]\); give 1 values"):  # fmt: skip
        op(torch.zeros(2, 1, 4, 4))
    op(torch.zeros(2, 3, 4, 4))  # the same op on the right channel count
