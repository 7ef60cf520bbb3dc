"""The streaming blocks of the README and of docs/streaming.md, run as written against real
servers (moto's S3 endpoint for mosaic and litdata, nginx for webdataset and Hugging Face), with
the pages' addresses swapped for the servers': each loader delivers every example four times in
an epoch."""

from __future__ import annotations

import collections
import re
import tempfile
from pathlib import Path

import pytest
from conftest import needs_nginx
from s3_server import S3Server
from streams_data import (
    N,
    epoch_ids,
    skip_without,
    upload,
    write_jsonl,
    write_litdata,
    write_mds,
    write_tars,
)

from dataecho.app.sources.nginx import NginxServer

skip_without("streaming", "litdata", "moto", "boto3", "webdataset", "datasets")
pytestmark = [needs_nginx, pytest.mark.filterwarnings("ignore:The given NumPy array")]
ROOT = Path(__file__).resolve().parents[2]
PAGES = {
    "README": ("README.md", "## Data over a network"),
    "docs": ("docs/streaming.md", "## The lines you change"),
}
LIBRARIES = ["from streaming import", "import litdata", "import webdataset", "load_dataset"]


def blocks(page: str) -> list[str]:
    path, heading = PAGES[page]
    section = (ROOT / path).read_text().split(heading)[1].split("\n## ")[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_streaming_page_has_a_block_per_library_and_the_readme_one_of_them():
    # the README's block is one of the page's, so running the page's runs it too
    assert [next(lib for lib in LIBRARIES if lib in b) for b in blocks("docs")] == LIBRARIES
    assert len(blocks("README")) == 1 and blocks("README")[0] in blocks("docs")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("readme")
    served = folder / "served"
    served.mkdir()
    for write in (write_tars, write_jsonl):  # each writes its own subfolder: flatten them
        for path in write(folder).iterdir():
            path.rename(served / path.name)
    with S3Server(folder) as s3, NginxServer(served) as nginx, pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env.items():
            mp.setenv(key, value)
        mp.setenv("HOME", str(folder))  # litdata's default cache is under ~/.lightning
        mp.setattr(tempfile, "tempdir", str(folder))  # mosaic's lock files, one per dataset
        swaps = {
            "s3://my-bucket/mds": upload(s3, write_mds(folder), "mds"),
            "s3://my-bucket/chunks": upload(s3, write_litdata(folder), "chunks"),
            "/tmp/mds": str(folder / "mds-cache"),
            "https://my-host": nginx.url,
        }
        yield swaps


@pytest.mark.parametrize("index", range(4))
def test_each_block_runs_as_written(servers, index):
    code = blocks("docs")[index]
    for readme, real in servers.items():
        code = code.replace(readme, real)
    if "from streaming import" in code:  # mosaic, given the tests' torchvision stand-in
        from mosaic_streaming import import_streaming

        import_streaming()
    scope: dict = {}
    exec(compile(code, f"docs/streaming.md block {index}", "exec"), scope)
    counts = collections.Counter(epoch_ids(scope["loader"]))
    assert counts == {i: 4 for i in range(N)}
