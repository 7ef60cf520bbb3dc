"""The memory benchmark's stream and its sampler: what runs, and what is read from ``/proc``.

:func:`run` streams, for ``Settings.minutes``, through the loader ``dataecho train
--checkpoint-dir`` builds (``make_loader``) from Fashion-MNIST shards served by a real nginx,
rate limited, into :class:`benchmarks.common.SyntheticStep`, with a checkpoint every
``checkpoint_every`` steps; a thread takes a :func:`sample` every ``sample_seconds``.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common

COLUMNS = ("seconds", "main_mib", "workers_mib", "workers", "pss_mib", "nginx_mib", "steps",
           "fresh", "epoch", "cpu_seconds", "total_mib")  # fmt: skip


@dataclass(frozen=True)
class Settings:
    minutes: float = 30.0
    warmup_minutes: float = 3.0
    sample_seconds: float = 5.0
    rate: int = 300_000  # bytes/s per nginx connection: ~130 fresh examples/s
    examples: int = 60_000
    examples_per_shard: int = 1000
    echo_factor: float = 4.0
    shuffle_buffer: int = 10_000
    batch_size: int = 128
    checkpoint_every: int = 500
    out: Path = common.results_dir("memory")


# --- /proc ------------------------------------------------------------------------------------


def rss_mib(pid: int | str, field: str = "VmRSS", file: str = "status") -> float:
    """Resident set (or another kB figure of ``/proc/PID/FILE``) in MiB; 0 once it exited."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def pss_mib(pid: int | str) -> float:
    return rss_mib(pid, "Pss", "smaps_rollup")


def children(pid: int | str) -> list[int]:
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in path.read_text().split()]
        except OSError:
            pass
    return found


def cpu_seconds(pid: int | str) -> float:
    try:  # after the command name: utime and stime are fields 11 and 12
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def sample(progress: dict[str, int], start: float) -> dict[str, float]:
    """One row: RSS of this process, its loader workers and nginx; counters; CPU so far."""
    workers, nginx, cpu, pss = [], 0.0, cpu_seconds("self"), pss_mib("self")
    for child in children("self"):
        try:
            name = Path(f"/proc/{child}/comm").read_text().strip()
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if name.startswith("nginx"):  # the master and its worker: the server, not ours
            nginx += rss_mib(child) + sum(rss_mib(c) for c in children(child))
        elif b"dataecho-nginx-watcher" in argv:  # the shell that stops nginx with this process
            nginx += rss_mib(child)
        else:
            workers.append(rss_mib(child))
            cpu, pss = cpu + cpu_seconds(child), pss + pss_mib(child)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers of finished epochs
    main = rss_mib("self")
    return {"seconds": time.monotonic() - start, "main_mib": main, "workers_mib": sum(workers),
            "workers": len(workers), "pss_mib": pss, "nginx_mib": nginx, **progress,
            "cpu_seconds": cpu + reaped.ru_utime + reaped.ru_stime,
            "total_mib": main + sum(workers)}  # fmt: skip


# --- the run ----------------------------------------------------------------------------------


def run(s: Settings, log: Any = print) -> list[dict[str, float]]:
    """Stream for ``s.minutes``; return the samples (see the module docstring)."""
    from dataecho.app.checkpoint_file import save_checkpoint
    from dataecho.app.config import TrainConfig
    from dataecho.app.sources.nginx import NginxServer
    from dataecho.app.training.loader import make_loader
    from dataecho.app.upstream import build_data, prepare

    common.pin_threads(1)
    prepare(s.out / "shards", examples=s.examples, examples_per_shard=s.examples_per_shard)
    progress = {"steps": 0, "fresh": 0, "epoch": 0}
    rows: list[dict[str, float]] = []
    stop = threading.Event()
    with NginxServer(s.out / "shards", rate_limit_bytes_per_s=s.rate) as server:
        cfg = TrainConfig(upstream=server.url, echo_factor=s.echo_factor, where="before_augment",
                          shuffle_buffer=s.shuffle_buffer, batch_size=s.batch_size,
                          num_workers=1, threads=1, checkpoint_dir=s.out / "checkpoints")  # fmt: skip
        data = build_data(cfg)
        loader, step = make_loader(cfg, data), common.SyntheticStep()
        start = time.monotonic()
        end = start + s.minutes * 60

        def sampler() -> None:
            while not stop.wait(max(0.0, start + len(rows) * s.sample_seconds - time.monotonic())):
                rows.append(sample(progress, start))

        thread = threading.Thread(target=sampler, name="rss-sampler", daemon=True)
        thread.start()
        log(f"streaming for {s.minutes:g} min from {data.description}")
        try:
            while time.monotonic() < end:
                data.set_epoch(progress["epoch"])
                for images, labels in loader:
                    step(images, labels)
                    progress["steps"] += 1
                    progress["fresh"] = loader.stats.fresh_examples
                    if progress["steps"] % s.checkpoint_every == 0:
                        state = {"model": step.model.state_dict(), "loader": loader.state_dict(),
                                 "optimizer": step.optimizer.state_dict()}  # fmt: skip
                        save_checkpoint(cfg.checkpoint_dir, state, step=progress["steps"], keep=1)
                    if time.monotonic() >= end:
                        break
                else:
                    progress["epoch"] += 1
        finally:
            stop.set()
            thread.join()
            rows.append(sample(progress, start))  # the end, with the worker still there
            loader.close()
    return rows
