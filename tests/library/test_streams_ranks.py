"""Two ranks under torchrun (gloo, CPU) read each streaming library through EchoingDataLoader
(tests/library/torchrun_streams.py): where the library splits by rank itself (mosaic, litdata,
webdataset's split_by_node, a Hugging Face stream already split) that split is used, never
split again; a Hugging Face stream not split by node is split by the loader. Either way the
ranks' examples are disjoint and together the whole data, each echoed twice."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_nginx
from s3_server import S3Server
from streams_data import N, skip_without, upload, write_jsonl, write_litdata, write_mds, write_tars

from dataecho.app.sources.nginx import NginxServer

skip_without("streaming", "litdata", "moto", "boto3", "webdataset", "datasets")
pytestmark = needs_nginx
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_read_disjoint_shares_of_every_library(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    write_tars(served), write_jsonl(served)
    out = tmp_path / "out"
    out.mkdir()
    with S3Server(tmp_path) as s3, NginxServer(served) as nginx:
        config = {"s3": s3.url, "http": nginx.url,
                  "mosaic": upload(s3, write_mds(tmp_path), "mds"),
                  "litdata": upload(s3, write_litdata(tmp_path), "litdata")}  # fmt: skip
        (out / "config.json").write_text(json.dumps(config))
        # TMPDIR: mosaic leaves a lock file per dataset in the temp folder.
        env = {**os.environ, **s3.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               "TMPDIR": str(tmp_path)}  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                   "--max-restarts", "0", str(HERE / "torchrun_streams.py"), str(out)]  # fmt: skip
        log = tmp_path / "torchrun.log"
        with open(log, "w") as sink:
            run = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        try:
            code = run.wait(timeout=200)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    assert code == 0, log.read_text()[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert {r.pop("world") for r in ranks} == {2}
    for library in ranks[0]:
        seen = [collections.Counter(r[library]) for r in ranks]
        assert not set(seen[0]) & set(seen[1]), f"{library}: an example on both ranks"
        assert set(seen[0]) | set(seen[1]) == set(range(N)), f"{library}: the whole data"
        assert all(set(c.values()) == {2} for c in seen), library
