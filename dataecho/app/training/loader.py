"""The training run's echoing loader, built from its config."""

from __future__ import annotations

import torch

from dataecho.app.config import TrainConfig
from dataecho.app.upstream import Data
from dataecho.loader import EchoingDataLoader
from dataecho.loader.reading import is_map_style


def make_loader(
    cfg: TrainConfig, data: Data, *, device: torch.device | None = None
) -> EchoingDataLoader:
    """The echoing loader of ``cfg`` over ``data.train`` (also what ``dataecho profile`` times):
    ``cfg.loader``'s settings, with the augmentation and the read order of the data.

    ``device``: the training device (:func:`dataecho.app.training.device.training_device`;
    None: the CPU). With ``where="device"`` the batches are echoed there; otherwise, on CUDA,
    the workers' batches come in pinned memory, for the loop's ``non_blocking`` copy.
    """
    device = device or torch.device("cpu")
    point = cfg.loader.point
    changes = {"echo_device": str(device)} if point.on_device else {}
    augmentations = (data.transform, data.batch_transform, data.device_transform)
    if point.lifts_dataset_transform and all(a is None for a in augmentations):
        # Nothing augments this workload's examples (char-lm in memory): their copies are
        # identical by design, as after_augment says (the same pipeline, without the loader's
        # warning about identical copies).
        changes["where"] = "after_augment"
    options = cfg.loader.with_changes(
        **changes,
        transform=data.transform,
        batch_transform=data.batch_transform,
        device_transform=data.device_transform,
        # An iterable upstream (shards) orders itself, as DataLoader requires.
        shuffle=is_map_style(data.train),
        drop_last=True,
    )
    return EchoingDataLoader(
        data.train,
        options=options,
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",
        seed=cfg.seed,
        # Without checkpoints the workers need not send their state (shuffle buffer
        # included) every few batches; with them, the loader's default keeps a resume's
        # replay short.
        **({} if cfg.checkpoint_dir else {"snapshot_every_n_steps": 1 << 30}),
    )
