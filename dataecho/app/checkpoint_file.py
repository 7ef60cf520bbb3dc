"""Checkpoint files: written atomically, read back with ``torch.load(weights_only=True)``.

    path = save_checkpoint("ckpt/", state, step=1200, keep=2)   # ckpt/step-00001200.pt
    path = latest_checkpoint("ckpt/")                             # None when there is none yet
    state = load_checkpoint(path)

Atomic: the state is written to a temp file in the same folder, flushed and fsynced, renamed
over the final name (``os.replace``, atomic on POSIX), and then the folder itself is fsynced.
A crash or ``kill -9`` at any point leaves the earlier checkpoints and either the whole new one
or none of it: never a torn file under a checkpoint's name. A killed writer's temp file is
never read and the next save removes it. A write that fails (a full disk, a folder gone or
made read-only) raises :class:`CheckpointError` naming the file and the reason, removes its
temp file and leaves the earlier checkpoints as they were.

Before a run spends its time, :func:`check_checkpoint_dir` makes sure its folder can be created
and written to and has room for the checkpoints to come.

Checksummed: a file is one header line, ``dataecho-checkpoint sha256 <64 hex> bytes <size>``,
then the payload that ``torch.save`` wrote; both go into the same temp file and the same rename.
:func:`load_checkpoint` reads the file, checks the payload's size and SHA-256 against the header
and only then hands the payload to ``torch.load``: a damaged or truncated file raises
:class:`DamagedCheckpointError` naming the file and what was found, and :func:`resume_from`
skips it for the newest intact one. So it does, with a warning naming the file and why, for a
file whose checksum holds but whose contents do not load (:class:`UnusableCheckpointError`:
``torch.load`` fails on it, it holds another structure, keys are missing, or the run cannot
load its model, optimizer or loader state from it).

Safe to load: a state may hold only tensors and plain containers and scalars (dict, list,
tuple, str, int, float, bool, None), which :func:`save_checkpoint` checks *before* writing, so
every payload loads with ``weights_only=True`` (no pickled code runs on load).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from dataecho import _validate
from dataecho.errors import DataechoError, DataechoTypeError

FORMAT = "dataecho-train-checkpoint"
VERSION = 1
_NAME = re.compile(r"step-(\d+)\.pt")
_TMP_PREFIX = ".tmp-"
# The header: this prefix, the payload's SHA-256 (64 hex digits), " bytes ", its size (16 digits).
_MAGIC = b"dataecho-checkpoint sha256 "
_HEADER = re.compile(rb"dataecho-checkpoint sha256 ([0-9a-f]{64}) bytes (\d{16})\n")
_HEADER_SIZE = len(_MAGIC) + 64 + len(b" bytes ") + 16 + 1
_PLAIN = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.Size)
# The least free space a checkpoint folder must have, whatever the estimate: below it the disk
# is as good as full (logs and temp files of the run need room too).
MIN_FREE_BYTES = 16 << 20


class CheckpointError(DataechoError, ValueError):
    """A checkpoint that cannot be used here; the message says which file and why."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose bytes are not those written: truncated, or its checksum differs.

    ``path`` is the file, ``reason`` what was found (without the file's name or the fix).
    """

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(
            f"{path}: damaged checkpoint, {reason}; it cannot be trusted: delete it, and resume "
            "(--resume) continues from the newest intact one before it"
        )


class UnusableCheckpointError(CheckpointError):
    """A checkpoint whose bytes are intact (its checksum holds) but whose contents do not load
    as a training checkpoint: ``torch.load`` fails, another structure, a key missing, a state
    the run cannot load. ``path`` is the file, ``reason`` what went wrong."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(
            f"{path}: its contents do not load as a training checkpoint ({reason}); move it out "
            "of the checkpoint folder, and resume (--resume) continues from the one before it"
        )


def save_checkpoint(
    directory: str | Path, state: dict[str, Any], *, step: int, keep: int = 2
) -> Path:
    """Write ``state`` as ``directory/step-NNNNNNNN.pt`` atomically; keep the ``keep`` newest.

    The format marker and version are added here. Returns the checkpoint's path.
    """
    step = _validate.non_negative_int(step, name="step")
    keep = _validate.positive_int(keep, name="keep", hint="how many checkpoints to keep")
    _check_plain(state, "state")
    directory = Path(directory)
    final = directory / f"step-{step:08d}.pt"
    tmp = directory / f"{_TMP_PREFIX}{final.name}.{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob(_TMP_PREFIX + "*"):  # a killed writer's leftovers
            stale.unlink(missing_ok=True)
        payload = io.BytesIO()
        torch.save({"format": FORMAT, "version": VERSION, **state}, payload)
        with open(tmp, "wb") as f:
            f.write(frame(payload.getvalue()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)  # the rename survives a power cut only once the folder is synced
    except (OSError, RuntimeError) as err:
        # torch.save reports a failed write to a file object as a RuntimeError whose context
        # is the OSError (e.g. "No space left on device").
        cause = _os_error(err)
        if cause is None:
            raise
        raise CheckpointError(
            f"cannot write checkpoint {final}: {reason(cause)}; {_kept(directory, final)}; "
            f"free space on that disk or fix {directory}, or set another checkpoint_dir"
        ) from err
    finally:
        with contextlib.suppress(OSError):  # a folder gone or unreadable: nothing to clean up
            tmp.unlink(missing_ok=True)
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def check_checkpoint_dir(
    directory: str | Path, *, need_bytes: int = MIN_FREE_BYTES, name: str = "checkpoint_dir"
) -> Path:
    """Fail now, not at the first checkpoint, if ``directory`` cannot take checkpoints.

    Creates the folder (and its parents), creates and removes a temp file in it, and checks
    that it has ``need_bytes`` free (at least :data:`MIN_FREE_BYTES`). Raises
    :class:`CheckpointError` saying what was found, what is needed and the fix; returns the
    folder. ``name`` is the setting the folder came from, for the message.
    """
    directory = Path(directory)
    fix = f"pick a folder you can write to ({name}, --{name.replace('_', '-')} DIR)"
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"{name}={str(directory)!r} is a file, not a folder; {fix}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(
            f"{name}={str(directory)!r} cannot be created: {reason(err)}; {fix}"
        ) from None
    try:
        fd, probe = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise CheckpointError(
            f"{name}={str(directory)!r} is not writable: creating a file in it failed: "
            f"{reason(err)}; {fix}"
        ) from None
    need = max(int(need_bytes), MIN_FREE_BYTES)
    free = shutil.disk_usage(directory).free
    if free < need:
        raise CheckpointError(
            f"{name}={str(directory)!r} has {_mib(free)} free, but its checkpoints need about "
            f"{_mib(need)}; free some space on that disk or pick a folder on another one"
        )
    return directory


def reason(err: OSError) -> str:
    """An OSError's reason as a person reads it: ``No space left on device (ENOSPC)``."""
    code = errno.errorcode.get(err.errno) if err.errno is not None else None
    text = err.strerror or str(err)
    return f"{text} ({code})" if code else text


def _os_error(err: BaseException) -> OSError | None:
    """``err`` if it is an OSError, else the OSError behind it (torch wraps write errors)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _kept(directory: Path, final: Path) -> str:
    """What a failed write leaves to resume from, for its error message."""
    try:
        earlier = [p for _, p in list_checkpoints(directory) if p != final]
    except OSError:
        return "the folder cannot be listed, so no earlier checkpoint can be named"
    if not earlier:
        return "there is no earlier checkpoint to resume from"
    return f"the previous checkpoint {earlier[-1]} is kept and resume (--resume) continues from it"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint in ``directory``, oldest first (none: ``[]``)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint of the highest step in ``directory``, or None when there is none."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def checkpoint_to_resume(directory: str | Path, resume: bool) -> Path | None:
    """The checkpoint a run resumes from (None: start afresh).

    Without ``resume`` a folder that already holds checkpoints is refused: a new run must not
    mix its checkpoints with an old run's.
    """
    path = latest_checkpoint(directory)
    if not resume and path is not None:
        raise CheckpointError(
            f"{directory} already holds checkpoints ({path.name}); continue that run with "
            "resume (--resume), or use an empty folder"
        )
    return path if resume else None


def frame(payload: bytes) -> bytes:
    """``payload`` behind its checksum header: the bytes of a checkpoint file."""
    digest = hashlib.sha256(payload).hexdigest()
    return _MAGIC + f"{digest} bytes {len(payload):016d}\n".encode() + payload


def verified_payload(path: str | Path) -> bytes:
    """The payload of the checkpoint file at ``path``, once its size and SHA-256 match its
    header; raises :class:`DamagedCheckpointError` (:class:`CheckpointError` for a file that
    is missing or cannot be read) before anything is unpickled."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read: {reason(err)}") from None
    if len(data) < _HEADER_SIZE:
        raise DamagedCheckpointError(path, f"truncated: {len(data):,} bytes, shorter than "
                                     "its checksum header")  # fmt: skip
    header = _HEADER.fullmatch(data[:_HEADER_SIZE])
    if header is None:
        raise DamagedCheckpointError(
            path, "no valid checksum header (damaged, or not written by this dataecho)"
        )
    expected, size = header.group(1).decode(), int(header.group(2))
    payload = data[_HEADER_SIZE:]
    if len(payload) < size:
        raise DamagedCheckpointError(path, f"truncated: {len(payload):,} of {size:,} bytes")
    if len(payload) > size:
        raise DamagedCheckpointError(path, f"{len(payload) - size:,} bytes past its end")
    found = hashlib.sha256(payload).hexdigest()
    if found != expected:
        raise DamagedCheckpointError(path, f"checksum sha256 {found}, expected {expected}")
    return payload


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state saved at ``path``, verified (:func:`verified_payload`), then loaded with
    ``weights_only=True`` onto the CPU."""
    path = Path(path)
    payload = verified_payload(path)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for bytes that are not a checkpoint
        # Only the first line: torch's advice to retry with weights_only=False is not for us.
        raise UnusableCheckpointError(
            path, f"cannot be read as a checkpoint: torch.load failed with {error_line(err)}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        what = f"a {type(state).__name__}" if not isinstance(state, dict) else "a dict without "
        what += f"format {FORMAT!r}" if isinstance(state, dict) else ""
        raise UnusableCheckpointError(path, f"not a dataecho training checkpoint: {what}")
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {state.get('version')!r}, this dataecho reads "
            f"version {VERSION}; resume with the dataecho that wrote it, or start afresh"
        )
    return state


def error_line(err: BaseException) -> str:
    """``Kind: first line of the message`` (at most 200 characters) of an error, for a reason:
    torch's further lines (advice to load with weights_only=False) are not for us."""
    text = str(err).strip()
    first = text.splitlines()[0][:200] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def resume_from(
    directory: str | Path,
    log: Callable[[str], Any],
    use: Callable[[Path, dict[str, Any]], Any] | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """The newest usable checkpoint in ``directory`` and its state (None: there is none yet).

    ``use(path, state)``, when given, loads the state into the run; it raises
    :class:`UnusableCheckpointError` for contents it cannot load (any other error stops the
    resume). A damaged checkpoint (:class:`DamagedCheckpointError`) or an unusable one is
    skipped for the one before, and ``log`` gets one warning line per skipped file naming it,
    why, and the one used instead. If none is usable, raises :class:`CheckpointError` listing
    them.
    """
    found = list_checkpoints(directory)
    if not found:
        return None
    skipped: list[DamagedCheckpointError | UnusableCheckpointError] = []
    for _, path in reversed(found):
        try:
            state = load_checkpoint(path)
            if use is not None:
                use(path, state)
        except (DamagedCheckpointError, UnusableCheckpointError) as err:
            skipped.append(err)
            continue
        for err in skipped:
            what = "damaged checkpoint" if isinstance(err, DamagedCheckpointError) else (
                "checkpoint whose contents do not load")  # fmt: skip
            log(f"warning: skipped {what} {err.path.name} ({err.reason}); "
                f"resuming from {path.name}")  # fmt: skip
        return path, state
    listed = "; ".join(f"{err.path.name}: {err.reason}" for err in skipped)
    word = "intact" if all(isinstance(e, DamagedCheckpointError) for e in skipped) else "usable"
    raise CheckpointError(
        f"no {word} checkpoint in {directory} ({listed}); move them away and start afresh "
        "without --resume, or restore the folder from a copy"
    )


def check_same(
    saved: dict[str, Any], current: dict[str, Any], keys: Iterable[str], path: str | Path
) -> None:
    """Raise :class:`CheckpointError` listing each of ``keys`` whose value differs."""
    diff = [f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}"
            for k in keys if saved.get(k) != current.get(k)]  # fmt: skip
    if diff:
        raise CheckpointError(
            f"{path} was written by a run with other settings ({'; '.join(diff)}); resuming "
            "would not continue that run: use its settings, or another checkpoint folder"
        )


def _check_plain(value: Any, where: str) -> None:
    """Refuse what ``weights_only=True`` could not load, naming where it sits in the state."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise DataechoTypeError(
                    f"{where}: key {k!r} of type {type(k).__name__}; use str or int"
                )
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise DataechoTypeError(
            f"{where} is a {type(value).__name__}, which torch.load(weights_only=True) cannot "
            "load; store tensors, numbers, strings, lists and dicts only"
        )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
