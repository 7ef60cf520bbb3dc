"""A dataset's own augmentation, lifted out of ``__getitem__`` to run on each echoed copy.

Most training code augments inside the dataset: a torchvision dataset applies
``self.transform`` (and ``self.target_transform``, or the joint ``self.transforms``) in
``__getitem__``, a Hugging Face ``datasets.Dataset`` applies the function given to
``set_transform`` / ``with_transform`` on access. Echoing what ``__getitem__`` returns would
repeat one augmentation. So with ``where="before_augment"``, echoing on and neither
``transform=`` nor ``batch_transform=`` given (:func:`lifts`), the pipeline reads through a
*raw view*, a copy of the dataset with that transform off (the user's object is never
changed), echoes the raw example and applies the lifted transform to each copy, seeded and
checkpointed as ``transform=`` is.

The kinds known here, found by their attributes (torchvision is never imported):

- torchvision-shaped: instance attributes ``transform``, ``target_transform``,
  ``transforms``. The raw view, a shallow copy, has all three set to None. Per copy,
  ``transform`` maps the input (the first item of a tuple or list sample, else the whole
  sample) and ``target_transform`` the target of an ``(input, target)`` sample. Without
  those two, a joint ``transforms`` is called as ``transforms(input, target)``; with them it
  is the pair torchvision builds from them (``StandardTransform``), and the two separate
  attributes win, as the datasets that read them (``ImageFolder``, ``FakeData``, ...) see
  them now.
- a Hugging Face ``datasets.Dataset`` whose format is custom: the raw view is
  ``with_format(None)`` with the same columns; per copy the transform gets the row as a
  batch of one and its result is un-nested, as ``datasets`` does for ``ds[i]``.
- a ``torch.utils.data.Subset`` of one of these: the same subset of the raw view.

This takes ``__getitem__`` to apply those attributes as torchvision's datasets do; a dataset
that uses them otherwise is read as it is with ``where="after_augment"`` or ``transform=``.
Anything else (a transform behind a property, a dataset keeping its own ``state_dict``, whose
state a copy would keep apart from the user's object, an iterable dataset) is read as it is;
:func:`warn_identical_copies` then says that the copies are identical, once.

The lifted transform runs in the pipeline's thread, the raw reads on the read-ahead thread
(``read_ahead``): a dataset whose ``__getitem__`` itself reseeds or draws from torch's global
RNG (torchvision's ``FakeData`` makes its images so) needs ``read_ahead=0`` for a
reproducible stream, as the ``read_ahead`` option says.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Subset

from dataecho.errors import DataechoError, DataechoTypeError
from dataecho.loader.reading import is_map_style, is_stateful
from dataecho.transforms import OnInput

VISION_ATTRIBUTES = ("transform", "target_transform", "transforms")


class IdenticalCopiesWarning(UserWarning):
    """Echoed copies of each example are identical though ``where="before_augment"``."""


class DatasetTransformError(DataechoError, ValueError):
    """A dataset's transform cannot be run per copy as its attributes stand."""


@dataclass(frozen=True)
class LiftedTransform:
    """A transform found in a dataset: how to read without it, and what to run per copy."""

    read_raw: Callable[[], Any]  # makes the raw view: the dataset with its transform off
    per_copy: Callable[[Any], Any]  # the transform, on one raw example


def lifts(opts: Any) -> bool:
    """Whether the loader's options leave a dataset's own transform to be run per copy."""
    return (
        opts.point.lifts_dataset_transform
        and opts.echoes
        and opts.transform is None
        and opts.batch_transform is None
    )


def find_transform(dataset: Any) -> LiftedTransform | None:
    """The transform ``dataset`` applies in ``__getitem__``, if it is of a kind known here (see
    the module docstring), else None. Makes no copy: :attr:`LiftedTransform.read_raw` does."""
    if not is_map_style(dataset) or is_stateful(dataset):
        return None
    if isinstance(dataset, Subset):
        inner = find_transform(dataset.dataset)
        if inner is None:
            return None
        return LiftedTransform(lambda: _subset_of(dataset, inner.read_raw()), inner.per_copy)
    hf_format = getattr(dataset, "format", None) if hasattr(dataset, "with_format") else None
    if isinstance(hf_format, dict) and hf_format.get("type") == "custom":
        return _hugging_face(dataset, hf_format)
    return _vision(dataset)


def warn_identical_copies(dataset: Any, opts: Any) -> None:
    """Warn that each example's copies are identical: the options echo before augmentation,
    but nothing runs per copy (see :func:`lifts`) and ``dataset`` has no transform known here."""
    if not lifts(opts) or find_transform(dataset) is not None:
        return
    factor = repr(opts.echo_factor) if opts.adaptive else f"{opts.echo_factor:g}"
    warnings.warn(
        f"EchoingDataLoader(where='before_augment', echo_factor={factor}): the "
        f"copies of each example are identical. No transform= or batch_transform= was given, "
        f"and {type(dataset).__name__} applies no transform the loader can run per copy (a "
        "torchvision-style transform attribute, or a Hugging Face set_transform), so every "
        "copy is the example __getitem__ returned. Pass the augmentation as transform= (it "
        "then runs on each copy), or pass where='after_augment' if identical copies are "
        "intended (this warning then goes away)",
        IdenticalCopiesWarning,
        stacklevel=4,  # the caller's `for batch in loader`
    )


def _subset_of(subset: Subset, raw: Any) -> Subset:
    view = copy.copy(subset)
    view.dataset = raw
    return view


# --- torchvision-shaped datasets ------------------------------------------------------------


def _vision(dataset: Any) -> LiftedTransform | None:
    own = getattr(dataset, "__dict__", {})
    # Instance attributes only: a shallow copy can switch those off without touching the
    # user's object (a property or a class attribute it could not).
    found = {name: own[name] for name in VISION_ATTRIBUTES if name in own}
    if not found or not all(f is None or callable(f) for f in found.values()):
        return None
    transform, target = found.get("transform"), found.get("target_transform")
    joint = found.get("transforms")
    if transform is None and target is None:
        if joint is None:
            return None
        per_copy: Callable[[Any], Any] = JointTransform(joint, type(dataset).__name__)
    else:
        if joint is not None and not _is_pair_of_separate(joint):
            name = type(dataset).__name__
            raise DatasetTransformError(
                f"{name} has both a joint transforms={joint!r} and transform={transform!r} / "
                f"target_transform={target!r}, so the loader cannot tell which one its "
                f"__getitem__ applies; keep one of them on the dataset, or pass the "
                f"augmentation as EchoingDataLoader(transform=...)"
            )
        if target is None:
            assert transform is not None  # not both None: that is the branch above
            per_copy = InputTransform(transform)
        else:
            per_copy = SeparateTransforms(transform, target, type(dataset).__name__)
    names = tuple(found)
    return LiftedTransform(lambda: _without(dataset, names), per_copy)


def _is_pair_of_separate(joint: Any) -> bool:
    """torchvision's ``StandardTransform``: it only holds ``transform`` and
    ``target_transform``, which the dataset keeps as attributes of its own as well."""
    return hasattr(joint, "transform") and hasattr(joint, "target_transform")


def _without(dataset: Any, names: tuple[str, ...]) -> Any:
    view = copy.copy(dataset)
    for name in names:
        setattr(view, name, None)
    return view


class InputTransform:
    """``transform`` on the input: the first item of a tuple or list sample, else the sample."""

    def __init__(self, transform: Callable[[Any], Any]) -> None:
        self.transform = transform
        self._on_first = OnInput(transform)

    def __call__(self, sample: Any) -> Any:
        if isinstance(sample, (tuple, list)):
            return self._on_first(sample)
        return self.transform(sample)


class SeparateTransforms:
    """``(input, target) -> (transform(input), target_transform(target))``; either may be
    None (left as it is)."""

    def __init__(
        self,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any],
        dataset_name: str,
    ) -> None:
        self.transform, self.target_transform = transform, target_transform
        self.dataset_name = dataset_name

    def __call__(self, sample: Any) -> Any:
        x, y = _pair(sample, self.dataset_name, "target_transform")
        if self.transform is not None:
            x = self.transform(x)
        return _like(sample, x, self.target_transform(y))


class JointTransform:
    """``(input, target) -> transforms(input, target)``, torchvision's joint form."""

    def __init__(self, transforms: Callable[[Any, Any], Any], dataset_name: str) -> None:
        self.transforms = transforms
        self.dataset_name = dataset_name

    def __call__(self, sample: Any) -> Any:
        x, y = _pair(sample, self.dataset_name, "transforms")
        x, y = self.transforms(x, y)
        return _like(sample, x, y)


def _pair(sample: Any, dataset_name: str, attribute: str) -> tuple[Any, Any]:
    if isinstance(sample, (tuple, list)) and len(sample) == 2:
        return sample[0], sample[1]
    shape = f"{len(sample)} items" if isinstance(sample, (tuple, list)) else "not a sequence"
    raise DatasetTransformError(
        f"{dataset_name}.{attribute} takes (input, target), so the loader runs it per copy on "
        f"(input, target) samples, but {dataset_name}[i] returned a {type(sample).__name__} "
        f"({shape}); make __getitem__ return (input, target), or pass the augmentation as "
        f"EchoingDataLoader(transform=...) (run per copy on the whole sample; the dataset's "
        f"own transform then stays in __getitem__)"
    )


def _like(sample: tuple | list, x: Any, y: Any) -> tuple | list:
    return [x, y] if isinstance(sample, list) else (x, y)


# --- Hugging Face datasets ------------------------------------------------------------------


def _hugging_face(dataset: Any, hf_format: dict[str, Any]) -> LiftedTransform | None:
    transform = (hf_format.get("format_kwargs") or {}).get("transform")
    if not callable(transform):
        return None
    columns = list(hf_format["columns"])
    all_columns = bool(hf_format["output_all_columns"])
    per_copy = RowAsBatch(transform, columns, all_columns)
    return LiftedTransform(
        lambda: dataset.with_format(None, columns=columns, output_all_columns=all_columns),
        per_copy,
    )


class RowAsBatch:
    """A ``datasets`` custom-format transform on one row, as ``ds[i]`` runs it: the formatted
    columns as a batch of one, the result un-nested, and (``output_all_columns``) the other
    columns added unchanged."""

    def __init__(
        self, transform: Callable[[dict], Any], columns: list[str], output_all_columns: bool
    ) -> None:
        self.transform = transform
        self.columns = columns
        self.output_all_columns = output_all_columns
        self._formatted = frozenset(columns)

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any]:
        # In the row's (the table's) column order, as datasets builds the batch.
        batch = self.transform({k: [v] for k, v in row.items() if k in self._formatted})
        if not isinstance(batch, Mapping):
            raise DataechoTypeError(
                f"the dataset's transform {self.transform!r} returned a "
                f"{type(batch).__name__}; as with datasets' ds[i], it must return a dict of "
                "sequences (a batch) so that a row can be picked from it"
            )
        out = {name: values[0] for name, values in batch.items()}
        if self.output_all_columns:
            out.update((k, v) for k, v in row.items() if k not in self._formatted)
        return out
