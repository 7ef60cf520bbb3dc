"""dataecho.errors: every error the project raises on purpose is a DataechoError.

Every module under ``dataecho/`` is imported (the library and the application) and every
exception class defined in it is checked. The only exceptions to the rule are classes that must
bypass ``except Exception`` (``BaseException`` subclasses that are not ``Exception``s); each says
why in a comment or its docstring. Warning categories are not errors and are not checked.
No module raises a bare ``ValueError`` or ``TypeError`` on purpose: bad arguments across the
library and the application raise :class:`DataechoValueError` / :class:`DataechoTypeError`,
which the usual ``except ValueError`` / ``except TypeError`` still catch. The command prints a
DataechoError as one line and lets any other exception (a bug) show its traceback.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import math
import pathlib
import pickle
import re
import subprocess
import sys
from types import ModuleType

import pytest
import torch

import dataecho
from dataecho import _validate, schedules
from dataecho.errors import DataechoError, DataechoTypeError, DataechoValueError

PACKAGE_DIR = pathlib.Path(dataecho.__file__).parent
# ``python -m`` entry points run the command when imported; they are read, not imported.
ENTRY_POINTS = {"__main__"}
EXCEPTION_LIKE = ("Error", "Exception", "Exit", "Interrupt", "BaseException")


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


MODULES = module_names()


def source_of(name: str) -> pathlib.Path:
    relative = pathlib.Path(*name.split("."))
    package = PACKAGE_DIR.parent / relative / "__init__.py"
    return package if package.is_file() else (PACKAGE_DIR.parent / relative).with_suffix(".py")


def classes_in(namespace: object, module: str) -> list[type]:
    """The classes defined in ``module`` reachable from ``namespace``, nested classes included."""
    found: list[type] = []
    for value in vars(namespace).values():
        if isinstance(value, type) and value.__module__ == module and value not in found:
            found.append(value)
            found += [c for c in classes_in(value, module) if c not in found]
    return found


def exception_classes(module: ModuleType) -> list[type[BaseException]]:
    return [
        c
        for c in classes_in(module, module.__name__)
        if issubclass(c, BaseException) and not issubclass(c, Warning) and c is not DataechoError
    ]


def says_why_it_bypasses_except_exception(cls: type) -> bool:
    """Whether the class's comments or docstring say it must get past ``except Exception``."""
    text = (inspect.getcomments(cls) or "") + inspect.getsource(cls)
    return re.search(r"\b(except|catch|catches) Exception\b", text) is not None


def test_every_module_is_found() -> None:
    # The finder must see the library, the application and their subpackages, or the checks
    # below would pass on nothing.
    for name in ("dataecho.errors", "dataecho.transforms", "dataecho.stages.fixed_echo",
                 "dataecho.loader.reading", "dataecho.app.sources.retrying",
                 "dataecho.app.shutdown", "dataecho.app.distributed.signals"):  # fmt: skip
        assert name in MODULES
    assert len(MODULES) > 50


def test_the_finder_sees_exception_classes_and_their_kinds() -> None:
    retrying = importlib.import_module("dataecho.app.sources.retrying")
    found = {c.__name__ for c in exception_classes(retrying)}
    assert {"UpstreamError", "ShardReadError", "BadRecordError", "TruncatedTransfer"} <= found
    shutdown = importlib.import_module("dataecho.app.shutdown")
    assert "Terminated" in {c.__name__ for c in exception_classes(shutdown)}


@pytest.mark.parametrize("name", [m for m in MODULES if m.rsplit(".", 1)[-1] in ENTRY_POINTS])
def test_entry_points_define_no_classes(name: str) -> None:
    tree = ast.parse(source_of(name).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)], (
        f"{name} runs the command when imported, so its classes cannot be checked here; "
        "define them in a module it imports"
    )


def problem(cls: type[BaseException]) -> str | None:
    """What is wrong with an exception class's bases, or None."""
    if not issubclass(cls, Exception):
        if says_why_it_bypasses_except_exception(cls):
            return None
        return (f"{cls.__qualname__} derives from BaseException without a comment saying why "
                "it must get past code that catches Exception")  # fmt: skip
    if issubclass(cls, DataechoError):
        return None
    builtin = next(b for b in cls.__mro__[1:] if b.__module__ == "builtins")
    return (f"{cls.__qualname__}({builtin.__name__}) should be "
            f"{cls.__qualname__}(DataechoError, {builtin.__name__})")  # fmt: skip


@pytest.mark.parametrize("name", [m for m in MODULES if m.rsplit(".", 1)[-1] not in ENTRY_POINTS])
def test_exception_classes_derive_from_dataecho_error(name: str) -> None:
    module = importlib.import_module(name)
    wrong = [p for p in map(problem, exception_classes(module)) if p is not None]
    assert not wrong, f"{name}: " + "; ".join(wrong)


class PlainValueError(ValueError):
    pass


class Bare(BaseException):
    pass


# A BaseException so that code which catches Exception on the way does not stop it.
class Explained(BaseException):
    pass


def test_the_check_tells_right_bases_from_wrong_ones() -> None:
    class Right(DataechoError, ValueError):
        pass

    assert problem(Right) is None and problem(Explained) is None
    assert problem(PlainValueError) == (
        "PlainValueError(ValueError) should be PlainValueError(DataechoError, ValueError)"
    )
    assert "Bare derives from BaseException without a comment" in problem(Bare)


@pytest.mark.parametrize("name", MODULES)
def test_no_exception_class_hides_in_a_function(name: str) -> None:
    """Classes made inside a function cannot be found by importing; keep exceptions at the top."""
    tree = ast.parse(source_of(name).read_text())
    hidden = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                bases = [ast.unparse(b) for b in getattr(node, "bases", [])]
                if isinstance(node, ast.ClassDef) and any(
                    b.endswith(EXCEPTION_LIKE) for b in bases
                ):
                    hidden.append(f"{node.name} in {function.name}()")
    assert not hidden, f"{name}: exception classes defined inside functions: {hidden}"


def test_a_dataecho_error_keeps_its_builtin_base_and_pickles() -> None:
    from dataecho.app.sources.retrying import ShardReadError, UpstreamError

    err = ShardReadError("http://127.0.0.1:1/x.tar: connection refused at byte 0")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ShardReadError and str(back) == str(err)
    assert isinstance(back, UpstreamError) and isinstance(back, OSError)
    assert isinstance(back, DataechoError)
    # Callers that know only the builtin still catch it; callers that know dataecho catch all.
    with pytest.raises(OSError):
        raise err
    with pytest.raises(DataechoError):
        raise err


# --- no bare ValueError or TypeError is raised on purpose --------------------------------------

# ``raise ValueError(...)`` / ``raise TypeError(...)`` left as they are, with why: each is a bug
# in the calling code, not an input a user can fix, so it keeps its traceback.
BARE_RAISES_ALLOWED = {
    # Only frameworks assign the private _iterator, and only None.
    ("dataecho.loader.echoing_loader", "EchoingDataLoader._iterator can only be reset to None"),
    # Every rank packs the same dataclass: another width is a payload from other code.
    ("dataecho.app.distributed.control", "a Control packs"),
}


def bare_raises(name: str) -> list[tuple[int, str]]:
    """``(line, message as source)`` of each ``raise ValueError(...)``/``raise TypeError(...)``."""
    found = []
    for node in ast.walk(ast.parse(source_of(name).read_text())):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
            continue
        func = node.exc.func
        if isinstance(func, ast.Name) and func.id in ("ValueError", "TypeError"):
            found.append((node.lineno, ast.unparse(node.exc.args[0]) if node.exc.args else ""))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_no_module_raises_a_bare_value_or_type_error(name: str) -> None:
    wrong = [
        f"line {line}: {text[:60]}"
        for line, text in bare_raises(name)
        if not any(name == m and s in text for m, s in BARE_RAISES_ALLOWED)
    ]
    assert not wrong, (
        f"{name} raises a bare ValueError/TypeError; raise DataechoValueError or "
        f"DataechoTypeError (dataecho.errors) for an input the caller can fix: {wrong}"
    )


def test_the_bare_raise_finder_finds_them() -> None:
    raises = bare_raises("dataecho.loader.echoing_loader")
    assert [text for _, text in raises] == [
        "'EchoingDataLoader._iterator can only be reset to None'"
    ]


# --- bad arguments across the library and the application -------------------------------------

DATA = list(range(8))


def _noop(batch: object) -> None:
    return None


def _app_config(**settings: object) -> object:
    from dataecho.app.config import TrainConfig

    return TrainConfig(**settings)


def _throttled(**kwargs: object) -> object:
    from dataecho.app.sources.throttled import Throttled

    return Throttled(DATA, **kwargs)


# (what is called, the builtin a caller who does not know dataecho would catch)
BAD_ARGUMENTS = {
    # The loader's options.
    "loader batch_size=0": (lambda: dataecho.EchoingDataLoader(DATA, batch_size=0), ValueError),
    "loader batch_size=None": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_size=None), ValueError),
    "loader echo_factor=0.5": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_size=2, echo_factor=0.5), ValueError),
    "loader echo_factor=[2]": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_size=2, echo_factor=[2]), TypeError),
    "loader where='middle'": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_size=2, where="middle"), ValueError),
    "loader num_workers='2'": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_size=2, num_workers="2"), TypeError),
    "loader persistent_workers without workers": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_size=2, persistent_workers=True),
        ValueError),
    "loader batch_sampler": (
        lambda: dataecho.EchoingDataLoader(DATA, batch_sampler=[[0, 1]]), ValueError),
    "loader options and echo_factor": (
        lambda: dataecho.EchoingDataLoader(
            DATA, batch_size=2, echo_factor=2, options=dataecho.LoaderOptions(batch_size=2)),
        TypeError),
    "LoaderOptions shuffle_buffer=-1": (
        lambda: dataecho.LoaderOptions(batch_size=2, shuffle_buffer=-1), ValueError),
    "LoaderOptions transform=3": (
        lambda: dataecho.LoaderOptions(batch_size=2, transform=3), TypeError),
    "LoaderOptions device without where=device": (
        lambda: dataecho.LoaderOptions(batch_size=2, echo_device="cpu"), ValueError),
    # The stages.
    "echo factor=0": (lambda: dataecho.echo(DATA, 0), ValueError),
    "echo factor='x'": (lambda: dataecho.echo(DATA, "x"), TypeError),
    "shuffle buffer_size=-1": (lambda: dataecho.shuffle(DATA, -1), ValueError),
    "stochastic_echo load_prob=0": (
        lambda: dataecho.stochastic_echo(DATA, load_prob=0.0, buffer_size=2), ValueError),
    "stochastic_echo load_prob='x'": (
        lambda: dataecho.stochastic_echo(DATA, load_prob="x", buffer_size=2), TypeError),
    "adaptive_echo policy": (
        lambda: dataecho.adaptive_echo(DATA, max_factor=2, policy="oldest"), ValueError),
    "mix_examples buffer_size=-1": (lambda: dataecho.mix_examples(DATA, -1), ValueError),
    "echo over a non-iterable": (lambda: dataecho.echo(5, 2), TypeError),
    # The library's other entry points.
    "cosine_decreasing p_max < p_min": (
        lambda: schedules.cosine_decreasing(0.25, 1.0, 10), ValueError),
    "EchoedGD no params": (lambda: dataecho.EchoedGD([], lr=0.1, k=2), ValueError),
    "EchoedGD lr='x'": (
        lambda: dataecho.EchoedGD([torch.zeros(1, requires_grad=True)], lr="x", k=2),
        TypeError),
    "profile over a non-iterable": (lambda: dataecho.profile(5, _noop), TypeError),
    "TrainingProgress refresh_seconds=0": (
        lambda: dataecho.TrainingProgress(refresh_seconds=0, disable=True), ValueError),
    "on_input of a non-callable": (lambda: dataecho.on_input(5), TypeError),
    # The shared checks every flag and config key goes through.
    "Int check": (lambda: _validate.Int(1).check("n", 0), ValueError),
    "Int type": (lambda: _validate.Int(1).check("n", 1.5), TypeError),
    "Int text": (lambda: _validate.Int(1).parse("many"), ValueError),
    "Real check": (lambda: _validate.Real(0, 1).check("x", 2.0), ValueError),
    "Real text": (lambda: _validate.Real(0).parse("abc"), ValueError),
    "Choice check": (lambda: _validate.Choice(("a", "b")).check("c", "z"), ValueError),
    "EchoFactor check": (lambda: _validate.EchoFactor(4).check("e", 8), ValueError),
    "EchoFactor text": (lambda: _validate.EchoFactor().parse("lots"), ValueError),
    "Bool check": (lambda: _validate.Bool().check("b", "yes"), TypeError),
    "Bool text": (lambda: _validate.Bool().parse("maybe"), ValueError),
    "PathValue check": (lambda: _validate.PathValue().check("p", 3), TypeError),
    "Text check": (lambda: _validate.Text().check("t", 3), TypeError),
    "OptionalCallable check": (
        lambda: _validate.OptionalCallable("batch").check("f", 3), TypeError),
    "seed": (lambda: _validate.seed(-1), ValueError),
    "EchoingDataLoader timeout=-2": (
        lambda: dataecho.EchoingDataLoader(range(8), batch_size=4, timeout=-2), ValueError),
    "EchoingDataLoader timeout=''": (
        lambda: dataecho.EchoingDataLoader(range(8), batch_size=4, timeout=""), TypeError),
    "EchoingDataLoader timeout=nan": (
        lambda: dataecho.EchoingDataLoader(range(8), batch_size=4, timeout=math.nan),
        ValueError),
    "EchoingDataLoader timeout=inf": (
        lambda: dataecho.EchoingDataLoader(range(8), batch_size=4, timeout=math.inf),
        ValueError),
    "EchoingDataLoader timeout without workers": (
        lambda: dataecho.EchoingDataLoader(range(8), batch_size=4, timeout=5), ValueError),
    # The application.
    "TrainConfig unknown key": (lambda: _app_config(echo_factr=2), TypeError),
    "TrainConfig resume without a folder": (lambda: _app_config(resume=True), ValueError),
    "TrainConfig upstream ftp": (lambda: _app_config(upstream="ftp://host/x"), ValueError),
    "Throttled delay and rate": (lambda: _throttled(delay=1.0, rate=1.0), ValueError),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_a_bad_argument_raises_a_dataecho_error(case: str) -> None:
    call, builtin = BAD_ARGUMENTS[case]
    with pytest.raises(builtin) as info:  # a caller who does not know dataecho still catches it
        call()
    err = info.value
    assert isinstance(err, DataechoError), f"{case}: {type(err).__qualname__}: {err}"


def test_the_argument_errors_are_exported_with_their_builtins() -> None:
    for name in ("DataechoError", "DataechoValueError", "DataechoTypeError"):
        assert name in dataecho.__all__
    assert dataecho.DataechoError is DataechoError
    assert dataecho.DataechoValueError is DataechoValueError
    assert dataecho.DataechoTypeError is DataechoTypeError
    assert issubclass(dataecho.DataechoValueError, ValueError)
    assert issubclass(dataecho.DataechoTypeError, TypeError)
    assert issubclass(dataecho.DataechoValueError, DataechoError)
    assert issubclass(dataecho.DataechoTypeError, DataechoError)


def test_a_flag_check_still_gives_argparse_its_message() -> None:
    convert = _validate.Int(1).argparse_type("examples")
    with pytest.raises(argparse.ArgumentTypeError, match="examples must be >= 1, got 0"):
        convert("0")


class Failing(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        raise DataechoValueError(f"record {i} is bad; rewrite the shards")


@pytest.mark.timeout(60)
def test_a_dataecho_error_in_a_loader_worker_keeps_its_type() -> None:
    # The command reports an error from a worker by its type, so torch's re-raise must keep it.
    loader = dataecho.EchoingDataLoader(Failing(), batch_size=2, num_workers=1)
    with pytest.raises(DataechoValueError, match="DataLoader worker process 0"):
        next(iter(loader))


# --- the command: one line for a DataechoError, a traceback for a bug --------------------------


def test_the_command_prints_a_dataecho_error_without_a_traceback(tmp_path, capsys) -> None:
    from dataecho.app.cli import main

    missing = tmp_path / "nowhere"
    assert main(["prepare", "--out", str(tmp_path / "shards"), "--data-dir", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith(f"dataecho prepare: error: Fashion-MNIST file not found: {missing}/")


def test_the_command_prints_a_library_argument_error_as_one_line(monkeypatch, capsys) -> None:
    import dataecho.app.train as train_module
    from dataecho.app.cli import main

    def train(cfg: object) -> None:  # the run reaches the library with a bad value
        dataecho.EchoingDataLoader(DATA, batch_size=2, echo_factor=0.5)

    monkeypatch.setattr(train_module, "train", train)
    assert main(["train"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "dataecho train: error: echo_factor must be >= 1 (1 = no echoing, 2 = every item "
        "twice), got 0.5; an echo stage cannot drop data, so use echo_factor=1 to turn "
        "echoing off\n"
    )


def test_the_command_lets_a_plain_value_error_show_its_traceback(monkeypatch, capsys) -> None:
    import dataecho.app.train as train_module
    from dataecho.app.cli import main

    def train(cfg: object) -> None:
        raise ValueError("a bug: not the user's to fix")

    monkeypatch.setattr(train_module, "train", train)
    with pytest.raises(ValueError, match="a bug") as info:
        main(["train"])
    assert not isinstance(info.value, DataechoError)
    assert "error:" not in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_console_command_prints_the_traceback_of_a_bug() -> None:
    code = (
        "import sys, dataecho.app.train as t\n"
        "def train(cfg): raise ValueError('a bug: not the user s to fix')\n"
        "t.train = train\n"
        "from dataecho.app.cli import main\n"
        "sys.exit(main(['train']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.rstrip().endswith("ValueError: a bug: not the user s to fix")
    assert "dataecho train: error:" not in done.stderr
