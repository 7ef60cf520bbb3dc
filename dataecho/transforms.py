"""Per-example transforms for ``(input, target)`` samples.

``EchoingDataLoader(transform=t)`` calls ``t`` on the whole sample. A torchvision-style dataset
yields ``(image, label)``, and its transforms take the image alone, so wrap them:

    loader = dataecho.EchoingDataLoader(dataset, batch_size=128,
                                        transform=dataecho.transforms.on_input(augment))

:func:`on_input` applies a transform to the input and passes the rest of the sample on;
:func:`guard_transform` is how the loader calls the user's transform: a transform that fails on
a tuple, list or dict sample gets an error that names the sample's structure and this fix.
Both return picklable objects (the loader sends the transform to its worker processes).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from dataecho.errors import DataechoError, DataechoTypeError

Transform = Callable[[Any], Any]

_FIX = "dataecho.transforms.on_input"


class OnInput:
    """``transform`` applied to a sample's input only; see :func:`on_input`."""

    def __init__(self, transform: Transform, key: Hashable | None = None) -> None:
        if not callable(transform):
            raise DataechoTypeError(
                f"on_input needs a callable transform, got {transform!r} of type "
                f"{type(transform).__name__}; pass the transform itself, e.g. on_input(augment)"
            )
        if key is not None and not isinstance(key, Hashable):
            raise DataechoTypeError(f"key must be a dict key (hashable) or None, got {key!r}")
        self.transform = transform
        self.key = key

    def __call__(self, sample: Any) -> Any:
        if isinstance(sample, Mapping):
            return self._on_mapping(sample)
        if isinstance(sample, (tuple, list)):
            return self._on_sequence(sample)
        raise DataechoTypeError(
            f"on_input({_name(self.transform)}) expects an (input, target, ...) tuple or list "
            f"or a dict sample, got {type(sample).__name__}; a sample that is the input "
            f"alone takes the transform itself: transform={_name(self.transform)}"
        )

    def _on_sequence(self, sample: tuple | list) -> tuple | list:
        index = 0 if self.key is None else self.key
        if isinstance(index, bool) or not isinstance(index, int):
            raise DataechoTypeError(
                f"on_input(..., key={self.key!r}) on a {type(sample).__name__} sample: the key "
                f"of a tuple or list sample is the input's position (an int; None means 0)"
            )
        if not -len(sample) <= index < len(sample):
            raise IndexError(
                f"on_input(..., key={index}) on a {type(sample).__name__} sample of "
                f"{len(sample)} items; use a position below {len(sample)}"
            )
        new = self.transform(sample[index])
        if isinstance(sample, list):
            out = list(sample)  # a new list: the sample may be the dataset's own object
            out[index] = new
            return out
        if hasattr(sample, "_fields"):  # a namedtuple keeps its type and field names
            return sample._replace(**{sample._fields[index]: new})  # type: ignore[attr-defined]
        items = list(sample)
        items[index] = new
        return tuple(items) if type(sample) is tuple else type(sample)(items)

    def _on_mapping(self, sample: Mapping) -> Mapping:
        if self.key is None:
            raise DataechoTypeError(
                f"on_input({_name(self.transform)}) got a dict sample with keys "
                f"{list(sample)}: name the input, e.g. "
                f"on_input({_name(self.transform)}, key={_first_key(sample)!r})"
            )
        if self.key not in sample:
            raise KeyError(
                f"on_input(..., key={self.key!r}): the sample has no such key; its keys are "
                f"{list(sample)}"
            )
        new = self.transform(sample[self.key])
        if isinstance(sample, dict):
            out = copy.copy(sample)  # same dict type (OrderedDict, ...), never the original
            out[self.key] = new
            return out
        return {**sample, self.key: new}

    def __repr__(self) -> str:
        key = "" if self.key is None else f", key={self.key!r}"
        return f"on_input({_name(self.transform)}{key})"


def on_input(transform: Transform, key: Hashable | None = None) -> OnInput:
    """``transform`` applied to the input of each sample only, the rest passed on unchanged.

    ``(x, y, *rest) -> (transform(x), y, *rest)`` for a tuple or list sample (a tuple stays a
    tuple, a namedtuple keeps its type, a list stays a list); ``key``, if given, is the input's
    position. A dict sample needs ``key``, the input's key: ``on_input(t, key="image")`` maps
    ``{"image": x, ...}`` to ``{"image": t(x), ...}`` (same dict type). The sample itself is
    never changed: the result is a new container. Picklable when ``transform`` is.
    """
    return OnInput(transform, key)


class SampleTransformError(DataechoError, TypeError):
    """A transform failed on a whole ``(input, target)`` sample; the message says how to apply
    it to the input only. Chained ``from`` the transform's own exception."""


class SampleTransformValueError(SampleTransformError, ValueError):
    """From a ValueError: code that catches ValueError still catches it."""


class SampleTransformAttributeError(SampleTransformError, AttributeError):
    """From an AttributeError: code that catches AttributeError still catches it."""


_EXPLAINED: dict[type[BaseException], type[SampleTransformError]] = {
    TypeError: SampleTransformError,
    ValueError: SampleTransformValueError,
    AttributeError: SampleTransformAttributeError,
}


class GuardedTransform:
    """Calls ``transform(sample)``; see :func:`guard_transform`."""

    def __init__(self, transform: Transform) -> None:
        self.transform = transform

    def __call__(self, sample: Any) -> Any:
        try:
            return self.transform(sample)
        except (TypeError, ValueError, AttributeError) as err:
            explained = self._explained(sample, err)
            if explained is None:
                raise
            raise explained from err

    def apply(self, samples: Iterable[Any]) -> list[Any]:
        """``[self(s) for s in samples]``, without a call of this wrapper per sample (a batch's
        worth of them cost more than an identity transform's own calls)."""
        out: list[Any] = []
        append, transform = out.append, self.transform
        sample = None
        try:
            for sample in samples:
                append(transform(sample))
        except (TypeError, ValueError, AttributeError) as err:
            explained = self._explained(sample, err)
            if explained is None:
                raise
            raise explained from err
        return out

    def _explained(self, sample: Any, err: BaseException) -> SampleTransformError | None:
        """The error to raise instead of ``err``, or None to let ``err`` pass unchanged."""
        # on_input already takes the sample apart: its errors are about the input itself.
        structured = isinstance(sample, (tuple, list, Mapping))
        if not structured or isinstance(self.transform, OnInput):
            return None
        kind = next(k for k in _EXPLAINED if isinstance(err, k))
        return _EXPLAINED[kind](_explain(self.transform, sample, err))

    def __repr__(self) -> str:
        return f"guard_transform({_name(self.transform)})"


def guard_transform(transform: Transform) -> GuardedTransform:
    """``transform`` as the loader calls it: ``transform(sample)``, errors explained.

    When ``transform`` raises TypeError, ValueError or AttributeError on a tuple, list or dict
    sample, the error raised instead is a :class:`SampleTransformError` (a TypeError; also a
    ValueError or AttributeError when the original was one) whose message names the
    transform, the sample's type and structure and the fix
    (``transform=dataecho.transforms.on_input(t)``), chained ``from`` the original so its
    traceback stays. Any other error, or an error on any other sample, passes unchanged.
    Already guarded transforms are returned as they are. Picklable when ``transform`` is.
    """
    if isinstance(transform, GuardedTransform):
        return transform
    return GuardedTransform(transform)


def _explain(transform: Transform, sample: Any, err: BaseException) -> str:
    name = _name(transform)
    if isinstance(sample, Mapping):
        fix = f"transform={_FIX}({name}, key={_first_key(sample)!r})"
        shape = "a dict sample"
    else:
        fix = f"transform={_FIX}({name})"
        shape = f"an (input, target) {type(sample).__name__} sample"
    return (
        f"transform {name} raised {type(err).__name__} ({err}) on a sample of type "
        f"{type(sample).__name__}: {_describe(sample)}. The loader calls the transform on "
        f"the whole sample; if {name} takes the input alone (as torchvision transforms do), "
        f"apply it to the input of {shape} only: {fix}"
    )


def _describe(x: Any, depth: int = 0) -> str:
    """A short description of a sample: containers opened one level, leaves by type/shape."""
    if isinstance(x, torch.Tensor):
        return f"Tensor{list(x.shape)} {str(x.dtype).removeprefix('torch.')}"
    if isinstance(x, np.ndarray):
        return f"ndarray{list(x.shape)} {x.dtype}"
    if depth > 0 and isinstance(x, (tuple, list, Mapping)):
        return f"{type(x).__name__} of {len(x)}"
    if isinstance(x, Mapping):
        items = [f"{k!r}: {_describe(v, depth + 1)}" for k, v in list(x.items())[:8]]
        more = ", ..." if len(x) > 8 else ""
        return "{" + ", ".join(items) + more + "}"
    if isinstance(x, (tuple, list)):
        items = [_describe(v, depth + 1) for v in x[:8]]
        more = f", ... ({len(x)} items)" if len(x) > 8 else ""
        body = ", ".join(items) + more
        return f"[{body}]" if isinstance(x, list) else f"({body})"
    return type(x).__name__


def _first_key(sample: Mapping) -> Hashable:
    """The likeliest input key of a dict sample: the first holding an array, else the first."""
    for k, v in sample.items():
        if isinstance(v, (torch.Tensor, np.ndarray)) or hasattr(v, "size"):
            return k
    return next(iter(sample), "image")


def _name(transform: Any) -> str:
    """A one-line name for a transform: its qualified name, a short repr, or its type."""
    qualname = getattr(transform, "__qualname__", None)
    if isinstance(qualname, str):
        return qualname
    text = repr(transform)
    if len(text) <= 60 and "\n" not in text and " object at 0x" not in text:
        return text
    return type(transform).__qualname__ + "(...)"
