"""Run by torchrun (tests/app/test_multinode.py): one rank's reads of 64 example ids, one epoch each
through an ``EchoingDataLoader`` without a sampler (0 and 1 loader workers) and with a
``DistributedSampler``; writes ``{scenario: [ids seen, in order]}`` to ``OUT/rank-R.json``.

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 ... tests/app/torchrun_shares.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from dataecho.loader import EchoingDataLoader

EXAMPLES = 64
ECHO_FACTOR = 2


class Ids(Dataset):
    """Example ``i`` is its own id."""

    def __len__(self) -> int:
        return EXAMPLES

    def __getitem__(self, i: int) -> int:
        return i


def epoch_ids(**loader_args: object) -> list[int]:
    loader = EchoingDataLoader(Ids(), batch_size=4, echo_factor=ECHO_FACTOR, seed=0,
                               **loader_args)  # fmt: skip
    with loader:
        return [i for batch in loader for i in batch.tolist()]


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # what a torchrun script does; the loader reads its rank
    rank = dist.get_rank()
    seen = {
        "workers=0": epoch_ids(shuffle=True, num_workers=0),
        "workers=1": epoch_ids(shuffle=True, num_workers=1),
        "sampler": epoch_ids(sampler=DistributedSampler(Ids(), shuffle=True, seed=0)),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps({"world": dist.get_world_size(), **seen}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
