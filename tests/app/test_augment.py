"""Augmentation: every output is a shift/flip of the input, all of them occur, seeding holds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dataecho.app.workloads.image_augment import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    Augment,
    normalize,
)
from dataecho.loader import EchoingDataLoader


def reference_variants(image: torch.Tensor, pad: int) -> dict[tuple[int, int, bool], torch.Tensor]:
    """Every pad-then-crop (by torch's own F.pad) and flip of ``image``, normalised."""
    x = normalize(image)
    fill = -FASHION_MNIST_MEAN / FASHION_MNIST_STD
    out = {}
    for flip in (False, True):
        src = x.flip(-1) if flip else x
        padded = F.pad(src, (pad, pad, pad, pad), value=fill)
        h, w = image.shape[1:]
        for oy in range(2 * pad + 1):
            for ox in range(2 * pad + 1):
                out[(oy, ox, flip)] = padded[:, oy : oy + h, ox : ox + w]
    return out


def match(out: torch.Tensor, variants: dict) -> list[tuple[int, int, bool]]:
    return [key for key, v in variants.items() if torch.allclose(out, v, atol=1e-6)]


def random_image(seed: int, shape=(1, 28, 28)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), pad=st.integers(0, 4), channels=st.integers(1, 3))
def test_every_output_is_one_shift_and_flip_of_the_input(seed, pad, channels):
    image = random_image(seed, (channels, 12, 10))
    before = image.clone()
    variants = reference_variants(image, pad)
    torch.manual_seed(seed)
    for _ in range(5):
        out = Augment(pad=pad)(image)
        assert out.dtype == torch.float32 and out.shape == image.shape
        assert match(out, variants), "output is no pad-and-crop/flip of the input"
    assert torch.equal(image, before)  # never in place


def test_all_shifts_and_both_flips_occur_roughly_uniformly():
    image = random_image(0)  # random pixels: every variant is distinct
    variants = reference_variants(image, 2)
    table = torch.stack([v.flatten() for v in variants.values()])
    torch.manual_seed(1)
    augment = Augment(pad=2)
    counts = torch.zeros(len(variants), dtype=torch.long)
    for _ in range(2000):
        distance = (table - augment(image).flatten()).abs().amax(dim=1)
        assert int((distance < 1e-5).sum()) == 1
        counts[distance.argmin()] += 1
    # 50 variants, 40 expected each; a fair draw stays far inside 10..80.
    assert int(counts.min()) >= 10 and int(counts.max()) <= 80


def test_no_shift_no_flip_is_plain_normalisation_for_uint8_and_float():
    image = random_image(3)
    plain = Augment(pad=0, flip=False)
    torch.testing.assert_close(plain(image), normalize(image))
    torch.testing.assert_close(plain(image.float() / 255), normalize(image))
    expected = (image.float() / 255 - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
    torch.testing.assert_close(normalize(image), expected)


def test_float_and_uint8_inputs_augment_alike_under_one_seed():
    image = random_image(4)
    torch.manual_seed(5)
    a = Augment()(image)
    torch.manual_seed(5)
    b = Augment()(image.float() / 255)
    torch.testing.assert_close(a, b)


def test_uses_the_global_torch_rng_so_a_seed_repeats_it():
    image = random_image(6)
    torch.manual_seed(7)
    first = [Augment()(image) for _ in range(10)]
    torch.manual_seed(7)
    again = [Augment()(image) for _ in range(10)]
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
    assert len({tuple(x.flatten().tolist()) for x in first}) > 1


def test_examples_keep_their_label_and_extra_fields():
    image = random_image(8)
    out = Augment()((image, 3, "extra"))
    assert isinstance(out, tuple) and out[1:] == (3, "extra") and out[0].dtype == torch.float32


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), pad=st.integers(0, 3), size=st.integers(1, 9))
def test_a_batch_augments_each_example_on_its_own(seed, pad, size):
    images = random_image(seed, (size, 2, 9, 8))
    labels = torch.arange(size)
    before = images.clone()
    torch.manual_seed(seed)
    out, out_labels = Augment(pad=pad)((images, labels))
    assert out.shape == images.shape and out.dtype == torch.float32
    assert torch.equal(out_labels, labels) and torch.equal(images, before)
    for image, augmented in zip(images, out, strict=True):
        assert match(augmented, reference_variants(image, pad))


def test_a_batch_draws_independently_and_repeats_under_a_seed():
    image = random_image(11)
    batch = image.expand(400, -1, -1, -1)  # one image 400 times: the draws alone differ
    variants = reference_variants(image, 2)
    torch.manual_seed(12)
    out = Augment(pad=2)(batch)
    torch.manual_seed(12)
    assert torch.equal(out, Augment(pad=2)(batch))
    seen = {match(x, variants)[0] for x in out}
    assert len(seen) >= 45  # 50 variants, 400 draws: a shared draw would give 1


def test_rejects_other_shapes_and_oversized_pads():
    with pytest.raises(
        ValueError, match=r"\(C, H, W\) or a batch \(B, C, H, W\), got shape \(28, 28\)"
    ):
        Augment()(torch.zeros(28, 28, dtype=torch.uint8))
    with pytest.raises(ValueError, match="pad=28 shifts the whole"):
        Augment(pad=28)(torch.zeros(1, 28, 28, dtype=torch.uint8))
    with pytest.raises(ValueError, match="pad must be >= 0"):
        Augment(pad=-1)


@pytest.mark.timeout(60)
def test_seeded_loader_augments_the_same_way_and_copies_differ():
    """Inside EchoingDataLoader (worker process): same seed, same batches; echoed copies differ."""
    data = [(random_image(i), i) for i in range(32)]

    def batches(seed):
        loader = EchoingDataLoader(
            data, batch_size=16, echo_factor=2, transform=Augment(), num_workers=1, seed=seed
        )
        return list(loader)

    a, b, c = batches(0), batches(0), batches(1)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c, strict=True))
    images = torch.cat([x[0] for x in a])
    labels = torch.cat([x[1] for x in a])
    # Echoing before augmentation: the two copies of an example are augmented independently.
    differ = sum(not torch.equal(*images[labels == i]) for i in range(32))
    assert differ >= 24  # 50 variants: two equal draws are rare


def test_draw_k_is_the_same_shift_and_flip_for_an_example_and_a_batch():
    """Draw k means (flipped, dy, dx) = (k // 25, k // 5 % 5 - 2, k % 5 - 2) at pad=2, on both
    paths: a seed picks the same augmentation whether examples or batches are augmented."""
    images = random_image(13, (64, 1, 28, 28))
    variants = [reference_variants(image, 2) for image in images]

    def variant(k: int) -> tuple[int, int, bool]:
        return (k // 5 % 5, k % 5, bool(k // 25))  # reference keys: padded offsets and the flip

    torch.manual_seed(14)
    draws = torch.randint(0, 50, (64,)).tolist()
    torch.manual_seed(14)
    batch = Augment(pad=2)(images)
    for out, k, v in zip(batch, draws, variants, strict=True):
        torch.testing.assert_close(out, v[variant(k)], rtol=0, atol=1e-6)
    torch.manual_seed(15)
    draws = [int(torch.randint(0, 50, ())) for _ in range(8)]
    torch.manual_seed(15)
    for image, k, v in zip(images, draws, variants, strict=False):
        torch.testing.assert_close(Augment(pad=2)(image), v[variant(k)], rtol=0, atol=1e-6)
