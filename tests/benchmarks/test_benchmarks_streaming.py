"""The streaming benchmark: a tiny real run over nginx (webdataset and Hugging Face streams),
its table, and nothing left behind; its pieces that need no server."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from conftest import needs_nginx  # noqa: E402

from benchmarks import streaming  # noqa: E402
from benchmarks.streaming import data, measure  # noqa: E402
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES  # noqa: E402
from dataecho.app.sources.nginx import Request  # noqa: E402

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The header and rows of each Markdown table in ``text``, in order."""
    found: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("| "):
            if not previous.startswith("| "):
                found.append([])
            found[-1].append([cell.strip() for cell in line.strip("|").split("|")])
        previous = line
    return [(block[0], block[2:]) for block in found]  # less the rule under each header


def processes_naming(text: str) -> list[str]:
    """The command lines of this machine's processes that contain ``text``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


@needs_data
@needs_nginx
@pytest.mark.alone
@pytest.mark.timeout(180)
def test_a_tiny_run_gives_the_table_and_leaves_nothing_behind(tmp_path):
    pytest.importorskip("webdataset")
    pytest.importorskip("datasets")
    # Run as a user runs it, in a process of its own: the libraries' own loaders fork their
    # workers from it, and a test process carries what its earlier tests left (threads, open
    # files) into every fork.
    temp = tmp_path / "tmp"  # the run's temp folders (its data, nginx's), to see them gone
    temp.mkdir()
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "streaming", "--libraries", "webdataset,hf",
         "--seconds", "0.5", "--examples", "512", "--per-shard", "128", "--rounds", "1",
         "--out", str(out)],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True,
        timeout=170,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    text = (out / "streaming.md").read_text()
    assert text in run.stdout
    assert "python -m benchmarks streaming --libraries webdataset,hf" in text
    (headers, rows), (detail_headers, detail) = tables(text)
    assert headers == streaming.HEADERS
    assert [row[0] for row in rows] == ["webdataset", "hf"]
    for row in rows:
        numbers = [row[i] for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12)]
        sent, needed = row[10].removesuffix(" MB").split(" / ")  # resume: sent / needed
        excess, shards = row[11].removesuffix(")").split(" KB (")  # and in shards per worker
        numbers += [sent, needed, excess, shards]
        assert all(math.isfinite(float(x.replace(",", ""))) for x in numbers), row
        assert float(needed) > 0 and float(row[12]) >= 0, row
    assert detail_headers == streaming.DETAIL_HEADERS
    assert [(r[0], r[1]) for r in detail] == [
        (lib, case.name) for lib in ("webdataset", "hf") for case in measure.CASES
    ]
    assert all(float(r[2].split()[0]) > 0 for r in detail), detail
    # Its servers, their watchers and its workers stopped, its temp folders removed.
    assert processes_naming(str(temp)) == []
    assert list(temp.glob("dataecho-*")) == []  # (torch keeps a compile cache there too)
    # (torch's own compile cache may appear there too: a cache it keeps, not the run's.)
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_each_example_maps_to_the_file_that_holds_it(tmp_path):
    shards = data.Shards(tmp_path, ("a", "b", "c"), (3, 3, 2), {"a": 30, "b": 30, "c": 20})
    assert [shards.shard_of(i) for i in range(8)] == list("aaabbbcc")
    assert shards.count == 8 and shards.shard_bytes == 80 and shards.bytes_per_example == 10


def test_only_shard_bodies_count_as_bytes_sent():
    log = [Request(200, 0, "/data/x/a.bin"),  # a HEAD: no body
           Request(200, 30, "/data/x/a.bin?versionId=1"), Request(206, 5, "/b.bin"),
           Request(200, 9, "/index.json"), Request(404, 153, "/c.bin")]  # fmt: skip
    assert measure._sent(log, {"a.bin", "b.bin", "c.bin"}) == {"a.bin": 30, "b.bin": 5}


def test_windows_add_up_over_rounds():
    a = measure.Window(10, 1280, 320, 1.0, 0.5, 0.1, 0, [(10.0, 320.0)])
    b = measure.Window(30, 3840, 960, 1.0, 0.1, 0.3, 1, [(30.0, 960.0)])
    total = a + b
    assert (total.steps, total.fresh, total.wall, total.short) == (40, 1280, 2.0, 1)
    assert total.steps_per_s == 20 and total.realized_factor == 4
    assert total.step_seconds == pytest.approx(0.01) and len(total.rounds) == 2
    assert math.isnan(measure.Window().steps_per_s)


# In a new interpreter: in this one, transformers may have been imported already.
MOSAIC_THEN_TRAINER = """
import importlib.util, sys
from benchmarks.streaming.mosaic_import import STANDINS, import_streaming

module = import_streaming()
assert hasattr(module, "StreamingDataset") and hasattr(module, "MDSWriter")
for name in STANDINS:  # gone again, or a real torchvision (its spec names a file)
    assert name not in sys.modules or sys.modules[name].__spec__.origin is not None, name
if importlib.util.find_spec("transformers") is not None:
    from transformers import Trainer  # its image code imports torchvision if it saw one
print("ok")
"""


@pytest.mark.timeout(120)
def test_mosaic_imports_without_torchvision_and_leaves_no_stand_in():
    if importlib.util.find_spec("streaming") is None:  # importing it may fail on torchvision
        pytest.skip("mosaicml-streaming not installed")
    run = subprocess.run([sys.executable, "-c", MOSAIC_THEN_TRAINER], cwd=ROOT,
                         capture_output=True, text=True, timeout=100)  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
