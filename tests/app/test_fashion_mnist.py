"""The IDX reader and the Fashion-MNIST dataset: real files, hand-made files, broken files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from dataecho.app.sources.fashion_mnist import (
    DEFAULT_DATA_DIR,
    FILES,
    INSTALL_COMMAND,
    DataNotFoundError,
    FashionMNIST,
    IDXFormatError,
    check_files,
    read_idx,
    write_idx,
    write_subset,
)

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file(),
    reason=f"Fashion-MNIST not installed ({INSTALL_COMMAND})",
)


def write_raw_idx(path: Path, array: np.ndarray, *, code: int) -> Path:
    """An IDX file written by hand (any type code, even invalid ones), independent of write_idx."""
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(array.dtype.newbyteorder(">")).tobytes())
    return path


def make_data_dir(root: Path, n_train: int = 20, n_test: int = 10) -> Path:
    """A folder with the four files, small, with known contents (image i is filled with i)."""
    for split, n in (("train", n_train), ("test", n_test)):
        images = np.broadcast_to(np.arange(n, dtype=np.uint8)[:, None, None], (n, 28, 28))
        labels = (np.arange(n) % 10).astype(np.uint8)
        write_idx(root / FILES[split][0], np.ascontiguousarray(images))
        write_idx(root / FILES[split][1], labels)
    return root


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", [".gz", ""])
def test_read_idx_round_trips_every_element_type(tmp_path, dtype, suffix):
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    got = read_idx(write_idx(tmp_path / f"a.idx{suffix}", array))
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, array)
    got[0, 0, 0] = 7  # writable: torch.from_numpy needs that
    codes = {np.uint8: 8, np.int8: 9, np.int16: 11, np.int32: 12, np.float32: 13, np.float64: 14}
    by_hand = read_idx(write_raw_idx(tmp_path / "b.gz", array, code=codes[dtype]))
    np.testing.assert_array_equal(by_hand, array)  # the layout is the standard, not our own


def test_write_idx_rejects_types_idx_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="IDX cannot store dtype int64; use one of uint8"):
        write_idx(tmp_path / "x.gz", np.zeros(3, np.int64))


def test_read_idx_rejects_bad_magic_naming_the_file(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00" + bytes(20))  # a gzip header inside: decompressed twice?
    with pytest.raises(IDXFormatError, match=r"bad\.gz.*not an IDX file.*1f8b0800"):
        read_idx(path)


def test_read_idx_rejects_unknown_type_and_truncated_data(tmp_path):
    with pytest.raises(IDXFormatError, match="unknown IDX element type 0x07"):
        read_idx(write_raw_idx(tmp_path / "t.gz", np.zeros(3, np.uint8), code=0x07))
    path = write_idx(tmp_path / "u", np.zeros((4, 5), np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(IDXFormatError, match=r"shape \(4, 5\) \(20 data bytes\), file has 17"):
        read_idx(path)
    (tmp_path / "v.gz").write_bytes(b"not gzip at all")
    with pytest.raises(IDXFormatError, match="not a valid gzip file"):
        read_idx(tmp_path / "v.gz")


def test_missing_file_error_names_path_install_command_and_option(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        FashionMNIST(tmp_path / "nowhere")
    message = str(info.value)
    assert str(tmp_path / "nowhere" / FILES["train"][0]) in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "--data-dir" in message
    assert isinstance(info.value, FileNotFoundError)


def test_check_files_needs_all_four(tmp_path):
    make_data_dir(tmp_path)
    check_files(tmp_path)
    (tmp_path / FILES["test"][1]).unlink()
    check_files(tmp_path, ("train",))
    with pytest.raises(DataNotFoundError, match="t10k-labels-idx1-ubyte.gz"):
        check_files(tmp_path)


def test_dataset_on_hand_made_files(tmp_path):
    ds = FashionMNIST(make_data_dir(tmp_path), "train")
    assert len(ds) == 20
    image, label = ds[13]
    assert image.dtype == torch.uint8 and image.shape == (1, 28, 28)
    assert type(label) is int and label == 3 and int(image[0, 5, 5]) == 13
    assert ds.images.shape == (20, 1, 28, 28) and ds.labels.dtype == torch.int64
    assert len(FashionMNIST(tmp_path, "test", limit=4)) == 4


def test_examples_are_copies_not_views_of_the_split(tmp_path):
    ds = FashionMNIST(make_data_dir(tmp_path))
    image, _ = ds[2]
    image.fill_(99)  # an in-place augmentation must not write into the dataset
    assert int(ds[2][0].max()) == 2 and int(ds.images[2].max()) == 2
    assert image.untyped_storage().nbytes() == 28 * 28  # pickles 784 bytes, not the split


def test_dataset_validates_shapes_labels_and_split(tmp_path):
    make_data_dir(tmp_path)
    write_idx(tmp_path / FILES["train"][1], np.arange(19, dtype=np.uint8) % 10)
    with pytest.raises(IDXFormatError, match="has 20 images but .* has 19 labels"):
        FashionMNIST(tmp_path)
    write_idx(tmp_path / FILES["train"][1], np.full(20, 10, np.uint8))
    with pytest.raises(IDXFormatError, match=r"label 10 out of range 0\.\.9"):
        FashionMNIST(tmp_path)
    write_idx(tmp_path / FILES["train"][0], np.zeros((20, 28, 27), np.uint8))
    with pytest.raises(IDXFormatError, match=r"shape \(N, 28, 28\), got uint8 \(20, 28, 27\)"):
        FashionMNIST(tmp_path)
    with pytest.raises(ValueError, match="split must be one of 'train', 'test', got 'val'"):
        FashionMNIST(tmp_path, "val")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        FashionMNIST(tmp_path, "test", limit=0)


@needs_data
def test_real_files_have_the_published_sizes_and_balanced_classes():
    for split, n in (("train", 60_000), ("test", 10_000)):
        ds = FashionMNIST(split=split)
        assert len(ds) == n and ds.images.shape == (n, 1, 28, 28)
        assert torch.bincount(ds.labels).tolist() == [n // 10] * 10
        assert int(ds.images.max()) == 255 and int(ds.images.min()) == 0
    image, label = ds[0]  # first test example: an ankle boot
    assert label == 9 and image.shape == (1, 28, 28)


@needs_data
def test_write_subset_copies_the_first_examples(tmp_path):
    write_subset(tmp_path, train=30, test=20)
    small, full = FashionMNIST(tmp_path, "test"), FashionMNIST(split="test", limit=20)
    assert len(small) == 20 and len(FashionMNIST(tmp_path)) == 30
    assert torch.equal(small.images, full.images) and torch.equal(small.labels, full.labels)
