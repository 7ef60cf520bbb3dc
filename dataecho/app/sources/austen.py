"""Jane Austen's six novels, read from the R data package ``janeaustenr`` without R.

Debian's ``r-cran-janeaustenr`` stores each novel as a character vector (one string per line
of the Project Gutenberg text) in an R lazy-load database, ``data/Rdata.rdx`` + ``Rdata.rdb``.
The ``.rdx`` is an RDS file (gzipped R serialization) holding a list: ``variables`` maps each
object name to an (offset, length) pair in the ``.rdb``, ``compressed`` says how each blob is
packed. Each blob is a 4-byte big-endian uncompressed length, then (compressed = 1) a zlib
stream, or (2, 3) a one-byte type ('Z' zlib, '2' bzip2, 'X' xz, '0' stored) and the data
(compressed = 0: the bare serialization). The R serialization inside is parsed by the
``rdata`` package; only this framing is done here.

Installing the package pulls in R; :func:`ensure_janeaustenr_data` gets just the data. The
validation split is the last 5% of each novel's characters: both splits hold every novel.
"""

from __future__ import annotations

import bz2
import lzma
import os
import subprocess
import zlib
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from dataecho import _validate
from dataecho.app.sources.fashion_mnist import DataNotFoundError
from dataecho.errors import DataechoError, DataechoValueError

INSTALLED_PACKAGE_DIR = Path("/usr/lib/R/site-library/janeaustenr")
PACKAGE = "r-cran-janeaustenr"
# Where `make` unpacks the package's data when R's package is not installed (no R needed).
DATA_CACHE = Path(os.environ.get("DATAECHO_CACHE", Path.home() / ".cache" / "dataecho"))
INSTALL_COMMAND = f"apt-get install {PACKAGE}"
DATA_ONLY_COMMAND = f"apt-get download {PACKAGE} && dpkg -x {PACKAGE}_*.deb DIR"
# Where `dpkg -x` puts the package inside DIR.
PACKAGE_SUBDIR = Path("usr/lib/R/site-library/janeaustenr")
# The R object names, in publication order (janeaustenr's austen_books() order).
NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
          "persuasion")  # fmt: skip
CACHED_PACKAGE_DIR = DATA_CACHE / "janeaustenr" / PACKAGE_SUBDIR
# The installed package if there is one, else the data-only copy `make` fetches.
DEFAULT_PACKAGE_DIR = (
    INSTALLED_PACKAGE_DIR
    if (INSTALLED_PACKAGE_DIR / "data" / "Rdata.rdx").is_file()
    else CACHED_PACKAGE_DIR
)
_BLOB_CODECS = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress,
                b"0": bytes}  # fmt: skip


class RDataFormatError(DataechoError, ValueError):
    """The lazy-load database is not laid out as expected (corrupt, or a format change)."""


def missing_data_error(path: Path) -> DataNotFoundError:
    """The error for a missing database: the path, both ways to get it, and the override."""
    return DataNotFoundError(
        f"janeaustenr data not found: {path}\n"
        f"Install it with:  {INSTALL_COMMAND}  (as root; this also installs R), or get the data "
        f"alone without R:  {DATA_ONLY_COMMAND}  and pass --data-dir DIR/{PACKAGE_SUBDIR} "
        f"(package_dir=... in Python; ensure_janeaustenr_data(DIR) does both steps)."
    )


def _unpack_blob(blob: bytes, compressed: int, name: str) -> bytes:
    """The serialized bytes of one .rdb entry (see the module docstring for the framing)."""
    if compressed == 0:  # saved uncompressed: no header at all
        return blob
    size, kind = int.from_bytes(blob[:4], "big"), b"Z" if compressed == 1 else blob[4:5]
    if kind not in _BLOB_CODECS or compressed not in (1, 2, 3):
        raise RDataFormatError(
            f"object {name!r}: unknown packing (compressed={compressed}, type byte "
            f"{blob[4:5]!r}); expected compressed 0, 1, or 2/3 with one of {list(_BLOB_CODECS)}"
        )
    try:
        data = _BLOB_CODECS[kind](blob[4 if compressed == 1 else 5 :])
    except (zlib.error, OSError, ValueError, lzma.LZMAError) as err:
        raise RDataFormatError(f"object {name!r}: cannot decompress ({err}); reinstall") from err
    if len(data) != size:
        raise RDataFormatError(f"object {name!r}: {len(data)} bytes, header says {size}")
    return data


def read_lazyload_db(stem: str | Path, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Objects ``names`` (default: all) of the R lazy-load database ``<stem>.rdx`` + ``.rdb``."""
    import rdata  # here, not at import: it loads pandas (half a second)

    stem = Path(stem)
    rdx, rdb = stem.with_suffix(".rdx"), stem.with_suffix(".rdb")
    for path in (rdx, rdb):
        if not path.is_file():
            raise missing_data_error(path)
    index = rdata.conversion.convert(rdata.parser.parse_data(rdx.read_bytes(), extension=".rds"))
    if not isinstance(index, dict) or "variables" not in index:
        raise RDataFormatError(f"{rdx}: expected a list with 'variables', got {type(index)}")
    variables = {str(k): (int(v[0]), int(v[1])) for k, v in index["variables"].items()}
    compressed = int(index.get("compressed", [1])[0])
    names = tuple(variables) if names is None else names
    missing = [n for n in names if n not in variables]
    if missing:
        raise RDataFormatError(f"{rdx}: no object(s) {missing}; it holds {sorted(variables)}")
    out = {}
    with rdb.open("rb") as f:
        for name in names:
            offset, length = variables[name]
            f.seek(offset)
            data = _unpack_blob(f.read(length), compressed, name)
            out[name] = rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))
    return out


def load_novels(package_dir: str | Path = DEFAULT_PACKAGE_DIR) -> dict[str, list[str]]:
    """The six novels as ``{object name: list of lines}``, in :data:`NOVELS` order."""
    objects = read_lazyload_db(Path(package_dir) / "data" / "Rdata", NOVELS)
    novels = {}
    for name, lines in objects.items():
        lines = lines.tolist() if getattr(lines, "ndim", 0) == 1 else [None]
        if not all(isinstance(s, str) for s in lines):
            raise RDataFormatError(f"object {name!r} is not a character vector without NA")
        novels[name] = lines
    return novels


def ensure_janeaustenr_data(
    cache_dir: str | Path = DATA_CACHE / "janeaustenr",
    *,
    installed: str | Path = INSTALLED_PACKAGE_DIR,
) -> Path:
    """The package folder: ``installed`` if present, else the data unpacked into ``cache_dir``.

    Runs ``apt-get download r-cran-janeaustenr`` and ``dpkg -x`` (no root, no R needed) once;
    later calls find ``cache_dir/usr/lib/R/site-library/janeaustenr`` and return at once.
    """
    if (Path(installed) / "data" / "Rdata.rdx").is_file():
        return Path(installed)
    cache_dir = Path(cache_dir)
    target = cache_dir / PACKAGE_SUBDIR
    if (target / "data" / "Rdata.rdx").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["apt-get", "download", PACKAGE], cwd=cache_dir, check=True,
                       capture_output=True, text=True)  # fmt: skip
        debs = sorted(cache_dir.glob(f"{PACKAGE}_*.deb"))
        subprocess.run(["dpkg", "-x", str(debs[-1]), str(cache_dir)], check=True,
                       capture_output=True, text=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError, IndexError) as err:
        detail = getattr(err, "stderr", None) or err
        raise DataNotFoundError(
            f"could not fetch {PACKAGE} into {cache_dir}: {str(detail).strip()}\n"
            f"Needs Debian's apt-get and dpkg and access to a Debian mirror; or run "
            f"{INSTALL_COMMAND} (as root) instead."
        ) from err
    return target


class CharVocab:
    """Characters <-> int ids: id 0 is ``<unk>``, then the known characters in code-point order.

    Built from text, so the same text always gives the same ids; ``CharVocab(vocab.chars)``
    rebuilds one (store ``chars`` with a checkpoint). ``decode`` writes ``<unk>`` as U+FFFD.
    """

    def __init__(self, chars: str) -> None:
        if list(chars) != sorted(set(chars)):
            raise DataechoValueError(
                f"chars must be sorted and unique, got {chars[:40]!r}; use from_text"
            )
        self.chars = chars
        self._ids = {c: i + 1 for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        """The vocabulary of every character in ``text``."""
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars) + 1

    def encode(self, text: str) -> torch.Tensor:
        """int64 ids of ``text``, 0 for characters not in the vocabulary."""
        get = self._ids.get
        return torch.tensor([get(c, 0) for c in text], dtype=torch.int64)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        table = "\ufffd" + self.chars
        return "".join(table[i] for i in torch.as_tensor(ids).tolist())


def split_novels(
    novels: dict[str, list[str]], val_fraction: float = 0.05
) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, val)`` texts per novel: lines joined by newlines, the last ``val_fraction``
    of each novel's characters going to validation."""
    if not 0 < val_fraction < 1:
        raise DataechoValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}; e.g. 0.05")
    train, val = {}, {}
    for name, lines in novels.items():
        text = "\n".join(lines)
        cut = round(len(text) * (1 - val_fraction))
        train[name], val[name] = text[:cut], text[cut:]
    return train, val


def token_chunks(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Rows of ``seq_len + 1`` ids starting every ``seq_len``: row[:-1] is an input, row[1:]
    its target, so each id is a target once. The tail that fills no whole row is dropped."""
    seq_len = _validate.positive_int(seq_len, name="seq_len")
    n = max(0, (len(ids) - 1) // seq_len)
    # A gather, not unfold(): a contiguous copy that pins no larger tensor, and n = 0 works.
    return ids[torch.arange(n).unsqueeze(1) * seq_len + torch.arange(seq_len + 1)]


class AustenChars(Dataset):
    """A map-style dataset of ``(input, target)`` int64 id sequences of length ``seq_len``.

    Args:
        split: "train" (the first 95% of each novel) or "val" (the last 5%).
        seq_len: characters per example; targets are the inputs shifted by one.
        package_dir: the janeaustenr folder (see :func:`load_novels`).
        novels: already loaded novels (skips a second load when building both splits).
        val_fraction: share of each novel's characters held out.

    The vocabulary (``vocab``) is built from all six novels, so both splits share ids and
    validation has no ``<unk>``. Chunks never cross from one novel into the next.
    """

    SPLITS = ("train", "val")

    def __init__(
        self,
        split: str = "train",
        seq_len: int = 64,
        *,
        package_dir: str | Path = DEFAULT_PACKAGE_DIR,
        novels: dict[str, list[str]] | None = None,
        val_fraction: float = 0.05,
    ) -> None:
        _validate.one_of(split, self.SPLITS, name="split")
        novels = load_novels(package_dir) if novels is None else novels
        texts = split_novels(novels, val_fraction)[self.SPLITS.index(split)]
        self.split, self.seq_len = split, _validate.positive_int(seq_len, name="seq_len")
        self.vocab = CharVocab.from_text("\n".join("\n".join(v) for v in novels.values()))
        rows = [token_chunks(self.vocab.encode(t), seq_len) for t in texts.values()]
        self.chunks = torch.cat(rows)  # (n, seq_len + 1) int64

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Copies, not views: a view would pickle the whole split to a worker process.
        row = self.chunks[index]
        return row[:-1].clone(), row[1:].clone()
