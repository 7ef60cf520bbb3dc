"""Exact shard resume: ShardDataset's own position, through the loader's checkpoints too.

A resume continues at the checkpoint's record: finished shards are not opened again, the
current shard's consumed records are passed over without decoding, and no example comes out
twice or goes missing (the shared save/load harness compares every item exactly).
"""

from __future__ import annotations

import io
import tarfile
import time

import numpy as np
import pytest
from conftest import needs_nginx, run_test_save_load_state, torch_roundtrip

from dataecho.app.sources.nginx import NginxServer
from dataecho.app.sources.shard_writer import write_image_shards
from dataecho.app.sources.shards import ShardDataset
from dataecho.loader import EchoingDataLoader


def synthetic(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """20 random images in 4 shards of 5."""
    out = tmp_path_factory.mktemp("shards")
    write_image_shards(*synthetic(20), out, examples_per_shard=5)
    return out


def next_epoch(dataset: ShardDataset) -> None:
    dataset.set_epoch(dataset.epoch + 1)


@pytest.mark.timeout(60)
def test_dataset_resumes_exactly_at_every_position(folder):
    recorded = run_test_save_load_state(
        lambda: ShardDataset(folder, shuffle_shards=True, seed=3),
        restore=lambda d, state: d.load_state_dict(state),
        new_epoch=next_epoch,
    )
    assert [len(e) for e in recorded] == [20, 20]
    assert [y for _, y in recorded[0]] != [y for _, y in recorded[1]]  # orders differ


@pytest.mark.timeout(60)
def test_resume_opens_no_finished_shard_and_decodes_no_consumed_record(folder, tmp_path):
    # A private copy whose finished shards we remove and whose consumed record we break:
    # a resume that read either would fail.
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    dataset = ShardDataset(tmp_path)
    it = iter(dataset)
    head = [next(it) for _ in range(12)]  # shards 0 and 1, and 2 records of shard 2
    state = torch_roundtrip(dataset.state_dict())
    assert {k: state[k] for k in ("shard", "offset", "skipped")} == {
        "shard": 2,
        "offset": 2,
        "skipped": 0,
    }
    rest = list(it)
    shards = sorted(tmp_path.glob("*.tar"))
    for f in shards[:2]:
        f.unlink()
    damage_png(shards[2], record=1)

    resumed = ShardDataset(tmp_path)  # on_bad_record="raise": a decoded bad record would raise
    resumed.load_state_dict(state)
    got = list(resumed)
    assert [y for _, y in got] == [y for _, y in rest]
    assert len(head) + len(got) == 20


def damage_png(shard, record: int) -> None:
    """Overwrite the PNG bytes of ``record`` in a tar shard (the tar stays well-formed)."""
    data = bytearray(shard.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        pngs = [m for m in tar.getmembers() if m.name.endswith(".png")]
    member = pngs[record]
    data[member.offset_data : member.offset_data + member.size] = b"\0" * member.size
    shard.write_bytes(bytes(data))


def test_a_state_for_other_workers_is_refused(folder):
    dataset = ShardDataset(folder)
    state = dataset.state_dict()
    state["readers"] = 2
    dataset.load_state_dict(state)
    with pytest.raises(ValueError, match="reader 0 of 2 .* loaded into reader 0 of 1; resume"):
        iter(dataset)
    with pytest.raises(ValueError, match=r"missing \['offset'"):
        dataset.load_state_dict({"epoch": 0, "reader": 0, "readers": 1, "shard": 0})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_checkpoints_carry_the_shard_position(folder, num_workers):
    def make():
        return EchoingDataLoader(
            ShardDataset(folder), batch_size=3, echo_factor=2, where="after_augment",
            shuffle_buffer=6, num_workers=num_workers, seed=5,
        )  # fmt: skip

    recorded = run_test_save_load_state(
        make,
        positions=[0, 4, 9] if num_workers == 0 else [4],  # each resume starts a worker
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
    )
    assert all(len(e) >= 13 for e in recorded)  # 40 copies of 20 examples in batches of 3
    # The position resumed from is the dataset's own (not a replay of the epoch's start).
    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    found = shard_positions(loader.state_dict())
    loader.close()
    assert found and all(p["shard"] >= 1 for p in found), found


def shard_positions(state) -> list[dict]:
    """Every ShardDataset position inside a (nested) loader state."""
    if isinstance(state, dict):
        if {"shard", "offset", "skipped"} <= set(state):
            return [state]
        return [p for v in state.values() for p in shard_positions(v)]
    if isinstance(state, (list, tuple)):
        return [p for v in state for p in shard_positions(v)]
    return []


@needs_nginx
@pytest.mark.timeout(60)
def test_resume_over_real_nginx_requests_only_the_unfinished_shards(folder):
    with NginxServer(folder) as server:
        log = server.prefix / "access.log"
        run_test_save_load_state(
            lambda: ShardDataset(server.url),
            epochs=1,
            positions=[0, 7, 20],
            restore=lambda d, state: d.load_state_dict(state),
            new_epoch=next_epoch,
        )
        dataset = ShardDataset(server.url)
        it = iter(dataset)
        want = [next(it) for _ in range(20)][13:]
        dataset = ShardDataset(server.url)
        dataset.load_state_dict({**dataset.state_dict(), "shard": 2, "offset": 3})
        before = len(log.read_text().splitlines())
        got = list(dataset)
        deadline = time.monotonic() + 5  # nginx logs a request just after its last byte
        while len(log.read_text().splitlines()) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # and anything more it would log
        requests = [line.split()[2] for line in log.read_text().splitlines()[before:]]
    assert [y for _, y in got] == [y for _, y in want]
    assert [r.rsplit("-", 1)[1] for r in requests] == ["000002.tar", "000003.tar"]
