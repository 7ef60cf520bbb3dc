"""dataecho.errors: every exception class the project defines derives from DataechoError.

Every module under ``dataecho/`` is imported (the library and the application) and every
exception class defined in it is checked. The only exceptions to the rule are classes that must
bypass ``except Exception`` (``BaseException`` subclasses that are not ``Exception``s); each says
why in a comment or its docstring. Warning categories are not errors and are not checked.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pickle
import re
from types import ModuleType

import pytest

import dataecho
from dataecho.errors import DataechoError

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
