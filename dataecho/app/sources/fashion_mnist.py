"""Fashion-MNIST from the standard gzipped IDX files (the Debian package ``dataset-fashion-mnist``).

The four files (``train-images-idx3-ubyte.gz`` and friends) are read with numpy and gzip alone,
checked (magic number, element type, shapes, label range) and held in memory: 60k + 10k images
of 28x28 uint8 are 55 MB, decompressed once per process.

IDX layout: two zero bytes, an element-type code, the number of dimensions, then each dimension
as a big-endian int32, then the data in C order.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from dataecho import _validate
from dataecho.errors import DataechoError, DataechoValueError

DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL_COMMAND = "apt-get install dataset-fashion-mnist"
SPLITS = ("train", "test")
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

# IDX element-type codes -> numpy big-endian dtypes.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class DataNotFoundError(DataechoError, FileNotFoundError):
    """A data file is missing; the message says how to install it or where to point instead."""


class IDXFormatError(DataechoError, ValueError):
    """A file is not a valid IDX file, or not the one expected."""


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (gzipped when the name ends in ``.gz``) into a native-endian array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (gzip.BadGzipFile, EOFError) as err:
        raise IDXFormatError(f"{path}: not a valid gzip file ({err}); reinstall it") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise IDXFormatError(
            f"{path}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'}, expected "
            f"00 00 <type> <ndim>); is it the right file, and not compressed twice?"
        )
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise IDXFormatError(
            f"{path}: unknown IDX element type 0x{code:02x}; valid: "
            f"{', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)}"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXFormatError(f"{path}: truncated header ({len(raw)} bytes, need {header})")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IDXFormatError(
            f"{path}: header says shape {shape} ({expected} data bytes), file has "
            f"{len(raw) - header}; the file is truncated or corrupt, reinstall it"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    # A copy: frombuffer over bytes is read-only, and torch wants writable memory.
    return data.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzipped when the name ends in ``.gz``); the inverse of
    :func:`read_idx`. For subsets of the data (tests, quick runs) and prepared copies."""
    path = Path(path)
    codes = {dtype.newbyteorder("="): code for code, dtype in _IDX_DTYPES.items()}
    array = np.asarray(array)
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None:
        raise DataechoValueError(
            f"IDX cannot store dtype {array.dtype}; use one of "
            f"{', '.join(str(d.newbyteorder('=')) for d in _IDX_DTYPES.values())}"
        )
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    data = np.ascontiguousarray(array, dtype=_IDX_DTYPES[code]).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + data)
    return path


def missing_data_error(path: Path) -> DataNotFoundError:
    """The error for a missing file: the path, the install command and the --data-dir option."""
    return DataNotFoundError(
        f"Fashion-MNIST file not found: {path}\n"
        f"Install it with:  {INSTALL_COMMAND}  (as root, or with sudo)\n"
        f"(it puts the files in {DEFAULT_DATA_DIR}), or, if you have the four "
        f"*-ubyte.gz files elsewhere, pass --data-dir DIR (data_dir=DIR in Python)."
    )


def check_files(data_dir: str | Path = DEFAULT_DATA_DIR, splits: tuple[str, ...] = SPLITS) -> None:
    """Raise :class:`DataNotFoundError` unless every file of ``splits`` is in ``data_dir``.

    Cheap (no reading), so a command can fail at once rather than after minutes of work.
    """
    for split in splits:
        _validate.one_of(split, SPLITS, name="split")
        for name in FILES[split]:
            path = Path(data_dir) / name
            if not path.is_file():
                raise missing_data_error(path)


def load_split(data_dir: str | Path = DEFAULT_DATA_DIR, split: str = "train"):
    """The ``(images, labels)`` of one split as numpy arrays: uint8 (N, 28, 28), int64 (N,)."""
    check_files(data_dir, (split,))
    image_file, label_file = (Path(data_dir) / name for name in FILES[split])
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise IDXFormatError(
            f"{image_file}: expected uint8 images of shape (N, 28, 28), got "
            f"{images.dtype} {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise IDXFormatError(
            f"{label_file}: expected uint8 labels of shape (N,), got {labels.dtype} {labels.shape}"
        )
    if len(images) != len(labels):
        raise IDXFormatError(
            f"{image_file} has {len(images)} images but {label_file} has {len(labels)} labels"
        )
    if len(labels) and int(labels.max()) >= len(CLASSES):
        raise IDXFormatError(
            f"{label_file}: label {int(labels.max())} out of range 0..{len(CLASSES) - 1}"
        )
    return images, labels.astype(np.int64)


def write_subset(
    out_dir: str | Path, *, train: int, test: int, data_dir: str | Path = DEFAULT_DATA_DIR
) -> Path:
    """Copy the first ``train`` / ``test`` examples of each split into ``out_dir``, same format.

    The copy loads in milliseconds: for tests and quick runs (``--data-dir out_dir``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        images, labels = load_split(data_dir, split)
        image_file, label_file = FILES[split]
        write_idx(out_dir / image_file, images[:n])
        write_idx(out_dir / label_file, labels[:n].astype(np.uint8))
    return out_dir


class FashionMNIST(Dataset):
    """A map-style dataset of ``(image, label)``: uint8 tensor (1, 28, 28) and an int in 0..9.

    Args:
        data_dir: the folder holding the four ``*-ubyte.gz`` files.
        split: "train" (60,000 examples) or "test" (10,000).
        limit: keep only the first ``limit`` examples (None: all), for quick runs and tests.

    ``images`` (N, 1, 28, 28) uint8 and ``labels`` (N,) int64 give the whole split as tensors,
    for fast evaluation without a loader.
    """

    def __init__(
        self,
        data_dir: str | Path = DEFAULT_DATA_DIR,
        split: str = "train",
        *,
        limit: int | None = None,
    ) -> None:
        images, labels = load_split(data_dir, split)
        if limit is not None:
            limit = _validate.positive_int(limit, name="limit", hint="or None for the whole split")
            images, labels = images[:limit], labels[:limit]
        self.split = split
        self.images = torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(1)
        self.labels = torch.from_numpy(labels)
        # Per-example reads go through numpy and a list, cheaper than torch indexing per call,
        # which matters at thousands of reads per second.
        self._images_np = self.images.numpy()
        self._labels_list = labels.tolist()

    def __len__(self) -> int:
        return len(self._labels_list)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        # A copy, not a view: a view would carry (and pickle to another process) the whole
        # split's storage, and an in-place change would write into the dataset.
        return torch.from_numpy(self._images_np[index].copy()), self._labels_list[index]
