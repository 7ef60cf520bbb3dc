"""The package's promises to its installers: the library needs only torch (a range, so the
user's torch stays), torchdata, numpy and tqdm; the application's needs come with the ``app``
extra; importing the library loads none of them; ``python -m dataecho.app`` is the command."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # the app extra brings tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Distribution names of the application's dependencies, and the modules they install.
APP_ONLY = {"matplotlib": "matplotlib", "webdataset": "webdataset", "rdata": "rdata",
            "pillow": "PIL"}  # fmt: skip


def requirements(entries: list[str]) -> dict[str, Requirement]:
    found = [Requirement(entry) for entry in entries]
    return {canonicalize_name(r.name): r for r in found}


BASE = requirements(PROJECT["dependencies"])
APP = requirements(PROJECT["optional-dependencies"]["app"])


def torch_releases_checked() -> dict[str, list[str]]:
    """The README's table of the torch releases the library's tests ran under (make compat):
    version -> its other cells (the tests' result, torch left in place)."""
    section = (ROOT / "README.md").read_text().split("\n## Install as a library\n")[1]
    section = section.split("\n## ")[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines()
            if line.startswith("|")]  # fmt: skip
    assert [cell.strip() for cell in rows[0]] == ["torch", "tests/library", "torch left in place"]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows[2:]}


CHECKED = torch_releases_checked()


def test_the_library_needs_only_torch_torchdata_numpy_and_tqdm():
    assert set(BASE) == {"torch", "torchdata", "numpy", "tqdm"}


def test_every_torch_release_checked_passed_and_kept_its_torch():
    assert len(CHECKED) >= 2, CHECKED
    for version, (result, kept) in CHECKED.items():
        Version(version)  # a release number, not a note
        assert "passed" in result and not re.search(r"\b(failed|errors?)\b", result), version
        assert kept == "yes", version


@pytest.mark.parametrize("version", sorted(CHECKED, key=Version))
def test_the_torch_range_admits_the_releases_the_library_supports(version):
    assert BASE["torch"].specifier.contains(version), (version, str(BASE["torch"].specifier))


def test_torch_is_a_range_not_a_pin_and_the_dev_pin_lies_in_it():
    specifier = BASE["torch"].specifier
    assert specifier, "torch needs a lower and an upper bound"
    assert all(s.operator not in ("==", "===") for s in specifier), str(specifier)
    # Nothing past the minors checked: not the one below the lowest, nor the one above the highest.
    lowest, highest = min(map(Version, CHECKED)), max(map(Version, CHECKED))
    below, above = f"{lowest.major}.{lowest.minor - 1}.0", f"{highest.major}.{highest.minor + 1}.0"
    assert not specifier.contains(below) and not specifier.contains(above), str(specifier)
    pins = [Requirement(line) for line in (ROOT / "constraints-dev.txt").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    dev_torch = [p for p in pins if canonicalize_name(p.name) == "torch"]
    assert len(dev_torch) == 1, pins
    (pinned,) = [s.version for s in dev_torch[0].specifier if s.operator == "=="]
    assert specifier.contains(pinned), (pinned, str(specifier))


@pytest.mark.parametrize("name", sorted(APP_ONLY))
def test_an_application_dependency_is_in_the_app_extra_not_in_the_base(name):
    assert name not in BASE
    assert name in APP


def test_the_command_checks_for_exactly_the_app_extras_modules():
    from dataecho.app import APP_REQUIREMENTS

    assert set(APP_REQUIREMENTS) == set(APP_ONLY.values())


@pytest.mark.parametrize("statement", ["import dataecho",
                                       "from dataecho import EchoingDataLoader"])  # fmt: skip
def test_importing_the_library_loads_no_application_dependency(statement):
    modules = sorted(APP_ONLY.values())
    code = (f"import sys\n{statement}\n"
            f"print(sorted(m for m in {modules!r} if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "[]"


FRAMEWORKS = {"transformers": "dataecho.frameworks.hf_trainer.LoaderStateCallback",
              "accelerate": "dataecho.frameworks.accelerate.register_loader"}  # fmt: skip


def test_the_framework_glue_imports_no_framework_and_says_which_one_it_needs():
    # Importing the glue loads no framework; with each framework then blocked as if not
    # installed, using the glue raises dataecho's FrameworkMissingError (an ImportError) that
    # names the package.
    frameworks = sorted(FRAMEWORKS)
    code = (
        "import sys\n"
        "from dataecho.frameworks import FrameworkMissingError, accelerate, hf_trainer\n"
        f"print(sorted(m for m in {frameworks!r} if m in sys.modules))\n"
        f"for name in {frameworks!r}: sys.modules[name] = None\n"
        "for use in (lambda: hf_trainer.LoaderStateCallback,\n"
        "            lambda: accelerate.register_loader(None, None)):\n"
        "    try:\n"
        "        use()\n"
        "    except FrameworkMissingError as error:\n"
        "        assert isinstance(error, ImportError)\n"
        "        print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert out.stdout.splitlines() == ["[]"] + [
        f"{glue} needs {name}, which is not installed: pip install {name}"
        for name, glue in FRAMEWORKS.items()
    ]


def test_python_m_dataecho_app_is_the_command():
    out = subprocess.run([sys.executable, "-m", "dataecho.app", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: dataecho ")
    for command in ("demo", "profile", "prepare", "train"):
        assert command in out.stdout


def test_the_library_source_imports_only_the_standard_library_and_its_four_dependencies():
    # Reads the source, so an import deferred into a function counts too. The one exception:
    # a streaming library's adapter imports that library, deferred into a function, which
    # runs only once the user has passed one of its datasets (so it is installed). The
    # frameworks' glue (dataecho/frameworks) has none: it imports its framework by name when
    # used (dataecho.frameworks.require; test_the_framework_glue_... above).
    allowed = {"dataecho", "torch", "torchdata", "numpy", "tqdm"} | set(sys.stdlib_module_names)
    own = {"mosaic.py": "streaming", "litdata.py": "litdata", "hf.py": "datasets",
           "webdataset.py": "webdataset"}  # fmt: skip
    found = {}
    for path in sorted((ROOT / "dataecho").rglob("*.py")):
        if "app" in path.relative_to(ROOT / "dataecho").parts:
            continue
        tree = ast.parse(path.read_text())
        if path.parent == ROOT / "dataecho" / "loader" / "streams" and path.name in own:
            deferred = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                        for n in ast.walk(f)}  # fmt: skip
            allowed_here = allowed | {own[path.name]}
        else:
            deferred, allowed_here = set(), allowed
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.ImportFrom):  # relative: resolved against the path
                package = list(path.relative_to(ROOT).parts[: -node.level])
                names = [".".join(package + [node.module] if node.module else package)]
                names += [f"{names[0]}.{alias.name}" for alias in node.names]
            else:
                continue
            ok = allowed_here if id(node) in deferred else allowed
            for name in names:
                if name.split(".")[0] not in ok or name.startswith("dataecho.app"):
                    found[f"{path.relative_to(ROOT)}:{node.lineno}"] = name
    assert not found, found


def test_the_package_ships_its_type_marker_and_its_license():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["dataecho"]
    assert (ROOT / "dataecho" / "py.typed").is_file()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    words = (ROOT / "LICENSE").read_text().split()
    assert words[:5] == ["Apache", "License", "Version", "2.0,", "January"], words[:5]
