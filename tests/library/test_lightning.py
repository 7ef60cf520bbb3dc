"""Real ``lightning.Trainer.fit`` runs with an EchoingDataLoader returned by ``train_dataloader()``.

Each example's label is its index in the dataset, and every ``training_step`` records the labels
it trains on: the tests assert exactly which examples Lightning trained, per epoch, across a
resume from a checkpoint, and per rank under DDP.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import wait_until

from dataecho import EchoingDataLoader

TESTS = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
    pytest.mark.usefixtures("one_thread"),
]


@pytest.fixture(scope="module")
def runs():
    """This file's Lightning runs (lightning_runs), imported by the process that runs the file
    rather than at collection in every test process: lightning takes a second to import."""
    import lightning_runs

    return lightning_runs


def counts(batches: list[list[int]]) -> collections.Counter:
    return collections.Counter(i for ids in batches for i in ids)


@pytest.mark.parametrize("where", ["before_augment", "batch"])
def test_each_epoch_trains_len_batches_and_every_example_echo_factor_times(runs, where):
    transform = runs.jitter if where == "before_augment" else None
    kwargs = {"batch_size": 8, "echo_factor": 2, "where": where, "transform": transform}
    module = runs.Recorder(
        {**kwargs, "shuffle": True, "shuffle_buffer": 48, "seed": 0}, one_cycle=True
    )
    trainer = runs.fit(module, max_epochs=2)
    assert len(module.loader) == 16 == trainer.num_training_batches  # 64 examples x 2 / 8
    assert [len(epoch) for epoch in module.epochs()] == [16, 16]
    for epoch in module.epochs():
        assert all(len(ids) == 8 for ids in epoch)
        assert counts(epoch) == {i: 2 for i in range(runs.N)}
    # The estimate is the real count: OneCycleLR refuses to step past total_steps.
    assert trainer.estimated_stepping_batches == 32 == trainer.global_step
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.total_steps == 32 and scheduler.last_epoch == 32
    assert module.loader.stats.fresh_examples == 2 * runs.N and module.loader.stats.batches == 32


@pytest.mark.parametrize("where", ["batch", "after_augment"])
def test_a_fractional_factor_trains_every_example_every_epoch(runs, where):
    # Lightning reads len(loader) once: an epoch that yielded fewer batches than another would
    # be cut short there, and some examples left untrained.
    kwargs = {"batch_size": 8, "echo_factor": 2.5, "where": where, "shuffle": True, "seed": 0}
    module = runs.Recorder(kwargs, n=40)
    trainer = runs.fit(module, max_epochs=3)
    assert [len(counts(epoch)) for epoch in module.epochs()] == [40, 40, 40]  # all trained
    # 5 fresh batches, 3 of them twice more; or 100 examples in batches of 8.
    assert len(module.loader) == 13 == trainer.num_training_batches
    assert [len(epoch) for epoch in module.epochs()] == [13, 13, 13]
    if where == "after_augment":  # exactly half of the examples 3 times, the rest twice
        for epoch in module.epochs():
            assert collections.Counter(counts(epoch).values()) == {3: 20, 2: 20}
    assert module.loader.stats.fresh_examples == 3 * 40


def test_lightning_epoch_e_trains_the_loaders_epoch_e(runs):
    # Lightning's setup_data calls iter() once and drops it unused: that starts no epoch.
    kwargs = {"batch_size": 8, "echo_factor": 2, "where": "after_augment", "shuffle": True,
              "seed": 0}  # fmt: skip
    module = runs.Recorder(kwargs)
    trainer = runs.fit(module, max_epochs=2)
    twin = EchoingDataLoader(runs.Indexed(runs.N), **kwargs)
    plain = [[y.tolist() for _, y in twin] for _ in range(2)]
    assert [len(epoch) for epoch in plain] == [16, 16]
    assert module.epochs() == plain
    assert module.loader.epoch == trainer.current_epoch - 1 == 1


def test_fractional_limit_train_batches_and_val_check_interval(runs):
    kwargs = {"batch_size": 8, "echo_factor": 2, "where": "after_augment", "shuffle": True,
              "seed": 0, "num_workers": 1, "shuffle_buffer": 0}  # fmt: skip
    module = runs.WithValidation(kwargs)
    trainer = runs.fit(module, max_epochs=2, limit_train_batches=0.5, val_check_interval=0.5)
    assert len(module.loader) == 16 and trainer.num_training_batches == int(0.5 * 16) == 8
    assert [len(epoch) for epoch in module.epochs()] == [8, 8]
    for epoch in module.epochs():
        # Copies of an example are adjacent (shuffle_buffer=0): half an epoch is 32 examples,
        # each trained twice.
        assert collections.Counter(counts(epoch).values()) == {2: 32}
    assert module.validations == 4  # after batches 4 and 8 of each epoch
    assert trainer.global_step == 16
    # Each epoch cut short left its workers running until the next iter() or the end of fit.
    assert wait_until(lambda: not multiprocessing.active_children(), timeout=5)


@pytest.mark.timeout(120)
def test_persistent_workers_serve_every_epoch_and_stop_at_the_end_of_fit(runs):
    kwargs = {"batch_size": 8, "echo_factor": 2, "where": "after_augment", "shuffle": True,
              "seed": 0, "num_workers": 1}  # fmt: skip
    module = runs.WorkerPids({**kwargs, "persistent_workers": True})
    runs.fit(module, max_epochs=3, limit_train_batches=0.5)  # epochs cut short, and validations
    twin = EchoingDataLoader(runs.Indexed(runs.N), **kwargs)
    plain = [[y.tolist() for _, y in twin][:8] for _ in range(3)]
    assert module.epochs() == plain and module.validations == 3
    assert len(module.pids) == 1  # the same worker in every epoch
    # Lightning resets the loader's _iterator at the end of fit: the kept worker stops too.
    assert wait_until(lambda: not multiprocessing.active_children(), timeout=5)


@pytest.mark.parametrize(
    ("num_workers", "k"),
    [(0, 5), (0, 21), (1, 11), (0, 16)],
    ids=["mid-epoch-0", "mid-epoch-1", "workers-mid-epoch-0", "last-batch-of-epoch-0"],
)
def test_resume_from_a_step_checkpoint_trains_what_the_uninterrupted_run_trains(
    runs, tmp_path, num_workers, k
):
    kwargs = {
        "batch_size": 8, "echo_factor": 2, "where": "after_augment", "shuffle": True,
        "shuffle_buffer": 5, "seed": 0, "num_workers": num_workers,
    }  # fmt: skip
    uninterrupted = runs.Recorder(kwargs)
    runs.fit(uninterrupted, max_epochs=2)
    assert len(uninterrupted.trained) == 32

    stopped = runs.Recorder(kwargs)
    checkpoint = runs.ModelCheckpoint(
        dirpath=tmp_path, filename="step", every_n_train_steps=k, save_top_k=-1
    )
    runs.fit(stopped, max_epochs=2, max_steps=k, callbacks=[checkpoint], enable_checkpointing=True)
    assert len(stopped.trained) == k

    resumed = runs.Recorder(kwargs)
    trainer = runs.fit(resumed, ckpt_path=tmp_path / "step.ckpt", max_epochs=2)
    assert len(resumed.trained) == 32 - k
    assert stopped.trained + resumed.trained == uninterrupted.trained  # ids and epochs, in order
    assert trainer.global_step == 32
    for got, want in zip(resumed.parameters(), uninterrupted.parameters(), strict=True):
        assert torch.equal(got, want)


def test_resume_from_an_end_of_epoch_checkpoint_trains_the_next_epoch(runs, tmp_path):
    # Lightning loads no loader state from a checkpoint taken at an epoch's end (a finished
    # epoch is not a restart), but it calls set_epoch(1) on loader.batch_sampler.sampler (the
    # loader's EpochHook) before the epoch: the new loader runs epoch 1's order and seeds.
    kwargs = {"batch_size": 8, "echo_factor": 2, "where": "after_augment", "shuffle": True,
              "seed": 0}  # fmt: skip
    uninterrupted = runs.Recorder(kwargs)
    runs.fit(uninterrupted, max_epochs=2)
    stopped = runs.Recorder(kwargs)
    checkpoint = runs.ModelCheckpoint(dirpath=tmp_path, filename="epoch", save_top_k=-1)
    runs.fit(stopped, max_epochs=1, callbacks=[checkpoint], enable_checkpointing=True)
    assert len(stopped.trained) == 16
    resumed = runs.Recorder(kwargs)
    runs.fit(resumed, ckpt_path=tmp_path / "epoch.ckpt", max_epochs=2)
    assert len(resumed.trained) == 16
    assert stopped.trained + resumed.trained == uninterrupted.trained


DDP_SCRIPT = """
import json, os, sys
from pathlib import Path

sys.path.insert(0, {tests!r})  # lightning_runs
import torch
from lightning_runs import Recorder, fit

if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    kwargs = {{"batch_size": 4, "echo_factor": 2, "where": "after_augment", "shuffle": True,
              "seed": 0, "num_workers": 1}}
    module = Recorder(kwargs)
    trainer = fit(module, max_epochs=2, strategy="ddp", devices=2, use_distributed_sampler=True)
    loader = module.loader
    result = {{
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "rank_variable": os.environ.get("RANK"),
        "len": len(loader),
        "num_training_batches": trainer.num_training_batches,
        "same_loader": trainer.train_dataloader is loader,
        "loader_type": type(trainer.train_dataloader).__name__,
        "sampler": None if loader.sampler is None else type(loader.sampler).__name__,
        "epochs": module.epochs(),
    }}
    (out / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(result))
"""


# A launcher's variables from the environment pytest runs in would steer the child's DDP setup.
_LAUNCH_VARIABLES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT",
}  # fmt: skip


def _processes_running(needle: str) -> list[int]:
    """Pids of live processes whose command line contains ``needle`` (forked workers too)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.mark.timeout(180)
def test_ddp_ranks_train_disjoint_halves_split_by_the_loader(runs, tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT.format(tests=str(TESTS))))
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert wait_until(lambda: not _processes_running(str(script)), timeout=10), (
        f"left behind: {_processes_running(str(script))}"
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, result in enumerate(ranks):
        assert result["rank"] == r and result["world_size"] == 2
        assert result["rank_variable"] is None  # Lightning sets no RANK: the process group does
        # No DistributedSampler injected, the loader not rebuilt: the rank split is its own.
        assert result["same_loader"] is True and result["loader_type"] == "EchoingDataLoader"
        assert result["sampler"] is None
        assert result["len"] == 16 == result["num_training_batches"]  # 32 examples x 2 / 4
        assert [len(epoch) for epoch in result["epochs"]] == [16, 16]
    shares = []
    for e in range(2):
        first, second = (counts(result["epochs"][e]) for result in ranks)
        assert set(first.values()) == set(second.values()) == {2}  # each echoed twice
        assert len(first) == len(second) == 32
        assert not set(first) & set(second)  # no example on both ranks
        assert set(first) | set(second) == set(range(runs.N))  # and none on neither
        shares.append(set(first))
    assert shares[0] != shares[1]  # each epoch a new shuffled split
