"""Run by torchrun (tests/library/test_streams_ranks.py): one rank's epoch of each streaming
library through an EchoingDataLoader at e = 2 with 2 workers; writes ``{library: [ids seen]}``
to ``OUT/rank-R.json``. The data's places come in ``OUT/config.json``; the S3 endpoint's
variables in the environment.

    torchrun --nproc-per-node 2 ... tests/library/torchrun_streams.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers

from streams_data import SHARDS, echoing, epoch_ids  # noqa: E402


def datasets_of(config: dict, cache: Path) -> dict:
    import datasets
    import litdata
    import webdataset as wds
    from datasets.distributed import split_dataset_by_node
    from mosaic_streaming import import_streaming

    streaming = import_streaming()
    files = [f"{config['http']}/jsonl/part-{s}.jsonl" for s in range(4)]
    tars = [f"{config['http']}/tars/shard-{s:02d}.tar" for s in range(SHARDS)]
    hf = datasets.load_dataset("json", data_files=files, streaming=True, split="train")
    rank, world = dist.get_rank(), dist.get_world_size()
    # One cache per node, as mosaic shares it between the node's ranks (its rank 0 fills it).
    local = cache / "node"
    return {
        "mosaic": streaming.StreamingDataset(remote=config["mosaic"], local=str(local / "mds"),
                                             batch_size=8, shuffle=True),
        "litdata": litdata.StreamingDataset(config["litdata"], shuffle=True,
                                            cache_dir=str(local / "litdata"),
                                            storage_options={"endpoint_url": config["s3"]}),
        "webdataset": wds.WebDataset(tars, shardshuffle=False, nodesplitter=wds.split_by_node)
        .decode().to_tuple("id.txt", "x.npy"),
        "hf not split": hf,
        "hf split": split_dataset_by_node(hf, rank=rank, world_size=world),
    }  # fmt: skip


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # what a torchrun script does; the loader reads its rank
    config = json.loads((out / "config.json").read_text())
    seen = {name: epoch_ids(echoing(ds, "after_augment", 2, 2))
            for name, ds in datasets_of(config, out / "caches").items()}  # fmt: skip
    rank = dist.get_rank()
    (out / f"rank-{rank}.json").write_text(json.dumps({"world": dist.get_world_size(), **seen}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
