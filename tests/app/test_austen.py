"""The janeaustenr reader, the char vocabulary, chunking and the dataset, on real and made data."""

from __future__ import annotations

import bz2
import lzma
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataecho.app.sources.austen import (
    DEFAULT_PACKAGE_DIR,
    INSTALL_COMMAND,
    NOVELS,
    PACKAGE_SUBDIR,
    AustenChars,
    CharVocab,
    DataNotFoundError,
    RDataFormatError,
    ensure_janeaustenr_data,
    load_novels,
    read_lazyload_db,
    split_novels,
    token_chunks,
)

HAVE_DATA = (DEFAULT_PACKAGE_DIR / "data" / "Rdata.rdx").is_file()
needs_data = pytest.mark.skipif(
    not HAVE_DATA, reason=f"janeaustenr not installed ({INSTALL_COMMAND})"
)
# Lines and characters per novel as R itself reports them: length(x), sum(nchar(x)).
R_COUNTS = {
    "sensesensibility": (12624, 661064),
    "prideprejudice": (13030, 671738),
    "mansfieldpark": (15349, 867930),
    "emma": (16235, 866793),
    "northangerabbey": (7856, 425555),
    "persuasion": (8328, 458526),
}


@pytest.fixture(scope="module")
def novels():
    if not HAVE_DATA:
        pytest.skip(f"janeaustenr not installed ({INSTALL_COMMAND})")
    return load_novels()


def serialize(obj) -> bytes:
    """R serialization (XDR) of a Python object, as R's serialize() writes it."""
    import rdata  # on first use, as the module under test does: it loads pandas

    return rdata.unparser.unparse_data(
        rdata.conversion.convert_python_to_r_data(obj), file_type="rds"
    )


def pack(data: bytes, compressed: int, kind: bytes = b"Z") -> bytes:
    """One .rdb entry in R's framing for ``compressed`` (and the type byte for 2 and 3)."""
    if compressed == 0:
        return data
    codecs = {b"2": bz2.compress, b"X": lzma.compress, b"0": bytes}
    codec = codecs.get(kind, zlib.compress)  # an unknown type byte over zlib data
    return len(data).to_bytes(4, "big") + (b"" if compressed == 1 else kind) + codec(data)


def write_db(stem: Path, objects: dict, compressed: int = 1, kind: bytes = b"Z") -> Path:
    """A lazy-load database ``stem``.rdx/.rdb holding ``objects`` (name -> Python value)."""
    import rdata  # on first use, as the module under test does: it loads pandas

    blobs, variables, offset = [], {}, 0
    for name, obj in objects.items():
        blob = pack(serialize(obj), compressed, kind)
        variables[name] = np.array([offset, len(blob)], dtype=np.int32)
        blobs.append(blob)
        offset += len(blob)
    stem.with_suffix(".rdb").write_bytes(b"".join(blobs))
    flag = np.array([True]) if compressed == 1 else np.array([compressed], dtype=np.int32)
    index = {"variables": variables, "references": {}, "compressed": flag}
    rdata.write_rds(stem.with_suffix(".rdx"), index)
    return stem


@pytest.mark.parametrize(("compressed", "kind"), [(0, b""), (1, b"Z"), (2, b"2"), (3, b"X"),
                                                  (3, b"Z"), (2, b"0")])  # fmt: skip
def test_lazyload_db_round_trips_every_packing(tmp_path, compressed, kind):
    objects = {"a": np.array(["first line", "", "£ and é"]), "b": np.array([1.5, 2.5])}
    stem = write_db(tmp_path / "Rdata", objects, compressed, kind)
    got = read_lazyload_db(stem)
    assert list(got) == ["a", "b"]
    assert got["a"].tolist() == ["first line", "", "£ and é"]
    np.testing.assert_array_equal(got["b"], [1.5, 2.5])
    assert list(read_lazyload_db(stem, ("b",))) == ["b"]


def test_lazyload_db_errors_name_the_problem(tmp_path):
    stem = write_db(tmp_path / "Rdata", {"a": np.array(["x"])})
    with pytest.raises(RDataFormatError, match=r"no object\(s\) \['zz'\]; it holds \['a'\]"):
        read_lazyload_db(stem, ("zz",))
    rdb = stem.with_suffix(".rdb")
    rdb.write_bytes(rdb.read_bytes()[:4] + b"garbage!" * 4)
    with pytest.raises(RDataFormatError, match="object 'a': cannot decompress"):
        read_lazyload_db(stem)
    data = serialize(np.array(["x"]))
    rdb.write_bytes((len(data) + 1).to_bytes(4, "big") + zlib.compress(data))
    with pytest.raises(RDataFormatError, match=rf"{len(data)} bytes, header says {len(data) + 1}"):
        read_lazyload_db(stem)
    write_db(stem, {"a": np.array(["x"])}, compressed=3, kind=b"Q")
    with pytest.raises(RDataFormatError, match=r"unknown packing \(compressed=3, type byte b'Q'\)"):
        read_lazyload_db(stem)


def test_load_novels_rejects_a_non_text_object(tmp_path):
    objects = {name: np.array(["line"]) for name in NOVELS} | {"emma": np.array([1.0, 2.0])}
    (tmp_path / "data").mkdir()
    write_db(tmp_path / "data" / "Rdata", objects)
    with pytest.raises(RDataFormatError, match="'emma' is not a character vector"):
        load_novels(tmp_path)


def test_missing_package_error_gives_both_commands_and_the_option(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        load_novels(tmp_path / "nowhere")
    message = str(info.value)
    assert str(tmp_path / "nowhere" / "data" / "Rdata.rdx") in message
    assert "apt-get install r-cran-janeaustenr" in message and "--data-dir" in message
    assert "apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb" in message
    assert isinstance(info.value, FileNotFoundError)


@needs_data
def test_real_novels_have_the_counts_r_reports(novels):
    assert tuple(novels) == NOVELS
    for name, (n_lines, n_chars) in R_COUNTS.items():
        lines = novels[name]
        assert len(lines) == n_lines and sum(map(len, lines)) == n_chars, name
        assert all(type(s) is str for s in lines)
    assert novels["sensesensibility"][0] == "SENSE AND SENSIBILITY"
    assert novels["prideprejudice"][9].startswith("It is a truth universally acknowledged")
    assert "her £20,000" in novels["mansfieldpark"][15221]  # the one non-ASCII char, as UTF-8


def test_ensure_data_uses_installed_or_cached_copy_without_running_anything(tmp_path, monkeypatch):
    installed = tmp_path / "installed"
    (installed / "data").mkdir(parents=True)
    (installed / "data" / "Rdata.rdx").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # any apt-get call would now fail
    assert ensure_janeaustenr_data(tmp_path / "cache", installed=installed) == installed
    cached = tmp_path / "cache" / PACKAGE_SUBDIR
    (cached / "data").mkdir(parents=True)
    (cached / "data" / "Rdata.rdx").write_bytes(b"")
    assert ensure_janeaustenr_data(tmp_path / "cache", installed=tmp_path / "no") == cached
    with pytest.raises(
        DataNotFoundError, match="could not fetch r-cran-janeaustenr into .*apt-get"
    ):
        ensure_janeaustenr_data(tmp_path / "other", installed=tmp_path / "no")


APT_KNOWS_PACKAGE = bool(shutil.which("apt-get") and shutil.which("dpkg")) and (
    subprocess.run(["apt-cache", "show", "r-cran-janeaustenr"], capture_output=True).returncode == 0
)


@pytest.mark.skipif(not APT_KNOWS_PACKAGE, reason="needs apt-get, dpkg and a Debian mirror")
@pytest.mark.timeout(180)
def test_ensure_data_downloads_and_unpacks_the_package(tmp_path):
    # The real download (~1.6 MB from the Debian mirror), unpacked without root and without R.
    folder = ensure_janeaustenr_data(tmp_path, installed=tmp_path / "not-installed")
    assert folder == tmp_path / PACKAGE_SUBDIR
    names = read_lazyload_db(folder / "data" / "Rdata").keys()
    assert set(NOVELS) <= set(names)
    assert len(load_novels(folder)["persuasion"]) == R_COUNTS["persuasion"][0]


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=60), st.text(max_size=40))
def test_vocab_round_trips_known_text_and_maps_unknown_to_unk(corpus, other):
    vocab = CharVocab.from_text(corpus)
    assert CharVocab.from_text(corpus[::-1]).chars == vocab.chars  # order-independent
    assert len(vocab) == len(set(corpus)) + 1
    ids = vocab.encode(corpus)
    assert ids.dtype == torch.int64 and int(ids.min()) >= 1 and vocab.decode(ids) == corpus
    decoded = vocab.decode(vocab.encode(other))
    assert decoded == "".join(c if c in vocab.chars else "\ufffd" for c in other)
    assert CharVocab(vocab.chars).encode(corpus).tolist() == ids.tolist()


def test_vocab_rejects_unsorted_or_repeated_chars():
    with pytest.raises(ValueError, match="sorted and unique, got 'ba'"):
        CharVocab("ba")
    with pytest.raises(ValueError, match="sorted and unique"):
        CharVocab("aab")


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 200), st.integers(1, 40))
def test_token_chunks_make_every_id_a_target_once(length, seq_len):
    ids = torch.arange(length) * 7
    rows = token_chunks(ids, seq_len)
    n = max(0, (length - 1) // seq_len)
    assert rows.shape == (n, seq_len + 1) and rows.is_contiguous()
    assert torch.equal(rows[:, :-1].flatten(), ids[: n * seq_len])
    assert torch.equal(rows[:, 1:].flatten(), ids[1 : n * seq_len + 1])


def test_split_keeps_the_last_fraction_of_each_novel():
    novels = {"a": ["x" * 99] * 10, "b": ["hello", "world"]}
    train, val = split_novels(novels, 0.1)
    for name, lines in novels.items():
        assert train[name] + val[name] == "\n".join(lines)
    assert len(val["a"]) == 100 and len(train["b"]) == 10
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\), got 1.5"):
        split_novels(novels, 1.5)


def test_dataset_on_hand_made_novels():
    novels = {"one": ["a" * 50, "a" * 49], "two": ["b" * 60, "c" * 39]}  # 100 chars each
    train = AustenChars("train", 8, novels=novels, val_fraction=0.2)
    val = AustenChars("val", 8, novels=novels, val_fraction=0.2)
    assert train.vocab.chars == "\nabc" and val.vocab.chars == "\nabc"
    assert len(train) == 2 * ((80 - 1) // 8) and len(val) == 2 * ((20 - 1) // 8)
    x, y = train[0]
    assert x.shape == y.shape == (8,) and torch.equal(x[1:], y[:-1])
    for row in train.chunks:  # no chunk runs from one novel into the next
        text = train.vocab.decode(row)
        assert not ("a" in text and ("b" in text or "c" in text))
    x.fill_(0)  # examples are copies: writing one leaves the dataset alone
    assert int(train[0][0].min()) > 0
    with pytest.raises(ValueError, match="split must be one of 'train', 'val', got 'test'"):
        AustenChars("test", novels=novels)


@needs_data
def test_real_dataset_splits(novels):
    train = AustenChars("train", 64, novels=novels)
    val = AustenChars("val", 64, novels=novels)
    assert len(train.vocab) == 82 and train.vocab.chars == val.vocab.chars
    assert 0.045 < len(val) / (len(train) + len(val)) < 0.055
    assert int(val.chunks.min()) > 0  # the vocabulary covers validation: no <unk>
    assert train.vocab.decode(train[0][0]).startswith("SENSE AND SENSIBILITY\n\nby Jane Austen")
    total = sum(len("\n".join(v)) for v in novels.values())
    assert len(train) * 64 + len(val) * 64 > total - 6 * 2 * 64  # only tails are dropped
