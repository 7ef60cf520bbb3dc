"""HF ``transformers.Trainer`` over an EchoingDataLoader: one callback resumes it exactly.

    from dataecho.frameworks.hf_trainer import LoaderStateCallback

    class EchoingTrainer(Trainer):
        def get_train_dataloader(self):
            return EchoingDataLoader(self.train_dataset, batch_size=..., seed=self.args.seed)

    trainer = EchoingTrainer(model=model, args=args, train_dataset=dataset,
                             callbacks=[LoaderStateCallback()])
    trainer.train(resume_from_checkpoint=True)

Trainer counts an epoch's steps from ``len(loader)`` and calls ``loader.set_epoch(e)`` before
each epoch. It resumes a run mid-epoch by skipping the epoch's first batches with accelerate's
``skip_first_batches``, which cannot go through an EchoingDataLoader (its batches are formed
after echoing). The callback resumes the loader from its own state instead: it writes
``loader.state_dict()`` into each checkpoint folder (``loader_state_<process index>.pt``), loads
it back when a run resumes from that checkpoint, and turns Trainer's skipping off
(``args.ignore_data_skip = True``) as the Trainer is made.

``LoaderStateCallback`` is a ``transformers.TrainerCallback``, built on first use: importing
this module does not import transformers.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import torch

from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.frameworks import require
from dataecho.loader import EchoingDataLoader

if TYPE_CHECKING:  # made by __getattr__ below
    LoaderStateCallback: type

NAME = "dataecho.frameworks.hf_trainer.LoaderStateCallback"
STATE_FILE = "loader_state_{}.pt"  # in the checkpoint folder, one per process


def _loader(train_dataloader: Any) -> EchoingDataLoader:
    """The EchoingDataLoader Trainer trains on, checked before the first step."""
    if not isinstance(train_dataloader, EchoingDataLoader):
        raise DataechoTypeError(
            f"{NAME} resumes an EchoingDataLoader, but this Trainer trains on a "
            f"{type(train_dataloader).__name__}: return an EchoingDataLoader from your "
            "Trainer subclass's get_train_dataloader(), or drop the callback (a torch "
            "DataLoader resumes through Trainer's own batch skipping)"
        )
    return train_dataloader


def state_path(args: Any, state: Any, prefix: str) -> str:
    """The loader's state file of this process in the checkpoint of ``state.global_step``."""
    folder = os.path.join(args.output_dir, f"{prefix}-{state.global_step}")
    return os.path.join(folder, STATE_FILE.format(args.process_index))


@functools.cache
def _callback_class() -> type:
    """``LoaderStateCallback``, made once transformers is imported."""
    transformers = require("transformers", NAME)
    prefix = require("transformers.trainer_utils", NAME).PREFIX_CHECKPOINT_DIR

    class LoaderStateCallback(transformers.TrainerCallback):  # type: ignore[name-defined]
        """Keeps the EchoingDataLoader's position in each of Trainer's checkpoints and loads it
        back on a resume (``trainer.train(resume_from_checkpoint=...)`` with a checkpoint under
        ``args.output_dir``); turns Trainer's own batch skipping off (``ignore_data_skip``).

        Raises ``DataechoTypeError`` when training starts on anything but an EchoingDataLoader,
        and ``DataechoValueError`` for a resumed checkpoint without the loader's state (written
        without this callback) or a callback added after the Trainer was made while
        ``ignore_data_skip`` is off."""

        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # Read when train() starts: Trainer's skipping would rebuild the loader as a torch
            # DataLoader, which an EchoingDataLoader cannot become.
            args.ignore_data_skip = True

        def on_train_begin(
            self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
            **kwargs: Any,
        ) -> None:  # fmt: skip
            loader = _loader(train_dataloader)
            if not args.ignore_data_skip:
                raise DataechoValueError(
                    f"{NAME} was added after the Trainer was made, with "
                    "TrainingArguments(ignore_data_skip=False): Trainer would skip a resumed "
                    "epoch's batches itself, which an EchoingDataLoader cannot go through; pass "
                    "the callback as Trainer(callbacks=[LoaderStateCallback()]), or set "
                    "ignore_data_skip=True"
                )
            if state.global_step == 0:  # a new run
                return
            path = state_path(args, state, prefix)
            if not os.path.isfile(path):
                raise DataechoValueError(
                    f"{NAME}: resuming at step {state.global_step}, but {path} does not exist: "
                    "the checkpoint was written without this callback, or is not under "
                    f"output_dir ({args.output_dir}); resume from a checkpoint that the "
                    "callback saved, there (without the loader's position the epoch would "
                    "start over)"
                )
            loader.load_state_dict(torch.load(path, weights_only=True))

        def on_save(
            self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
            **kwargs: Any,
        ) -> None:  # fmt: skip
            path = state_path(args, state, prefix)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(_loader(train_dataloader).state_dict(), path)

    LoaderStateCallback.__module__ = __name__
    return LoaderStateCallback


def __getattr__(name: str) -> Any:
    # The callback class derives from transformers' own: made on first access only.
    if name == "LoaderStateCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LoaderStateCallback"]
