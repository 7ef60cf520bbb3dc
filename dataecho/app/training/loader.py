"""The training run's echoing loader, built from its config."""

from __future__ import annotations

from dataecho.app.config import TrainConfig
from dataecho.app.upstream import Data
from dataecho.loader import EchoingDataLoader
from dataecho.loader.reading import is_map_style


def make_loader(cfg: TrainConfig, data: Data) -> EchoingDataLoader:
    """The echoing loader of ``cfg`` over ``data.train`` (also what ``dataecho profile`` times)."""
    return EchoingDataLoader(
        data.train,
        batch_size=cfg.batch_size,
        echo_factor=cfg.echo_factor,
        max_echo_factor=cfg.max_echo_factor,
        reuse_buffer=cfg.reuse_buffer,
        reuse_policy=cfg.reuse_policy,
        where=cfg.where,
        shuffle_buffer=cfg.shuffle_buffer,
        transform=data.transform,
        batch_transform=data.batch_transform,
        num_workers=cfg.num_workers,
        seed=cfg.seed,
        # An iterable upstream (shards) orders itself, as DataLoader requires.
        shuffle=is_map_style(data.train),
        drop_last=True,
        # Without checkpoints the workers need not send their state (shuffle buffer
        # included) every few batches; with them, the loader's default keeps a resume's
        # replay short.
        **({} if cfg.checkpoint_dir else {"snapshot_every_n_steps": 1 << 30}),
    )
