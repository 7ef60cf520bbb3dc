"""The library's tests under another torch, in a throwaway venv (``make compat TORCH=2.9.1``).

    python scripts/compat.py 2.9.1

1. A venv under the temporary folder, with ``torch==2.9.1`` from the package index.
2. The checkout installed as a user installs it (``pip install .``, no extras); torch must
   still be 2.9.1.
3. The tools ``tests/library`` needs, as pyproject.toml names them, in the releases that admit
   this torch: the dev extra's test runners and frameworks, and the app extra's packages (its
   ``test_errors.py`` imports every module, the application's too). torch is checked again.
4. ``tests/library`` on two processes; the venv is deleted, whatever the outcome.

It installs with uv (the dev set-up's, next to this Python, else the one on PATH), which reads
no pip configuration: only the package index decides which torch there is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # the app extra brings tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# The dev extra's entries that tests/library imports or runs under.
TEST_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "lightning", "datasets",
              "accelerate", "transformers"}  # fmt: skip
PYTEST = ["-q", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "tests/library"]


def tool_requirements() -> list[str]:
    """The app extra's entries and the dev extra's TEST_TOOLS, as pyproject.toml writes them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return extras["app"] + [r for r in extras["dev"] if Requirement(r).name in TEST_TOOLS]


def installed_torch(python: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('torch'))"
    return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True,
                          ).stdout.strip()  # fmt: skip


def check_torch(python: Path, wanted: str, after: str) -> None:
    found = installed_torch(python)
    print(f"compat: torch {found} after installing {after}", flush=True)
    if found != wanted:
        sys.exit(f"compat: installing {after} replaced torch {wanted} with {found}")


def main(torch: str) -> int:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        sys.exit("compat: needs uv (pip install uv)")
    venv = Path(tempfile.mkdtemp(prefix=f"dataecho-torch-{torch}-"))
    python = venv / "bin" / "python"
    try:
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, venv], check=True)
        install = [uv, "pip", "install", "-q", "--python", python]
        subprocess.run([*install, f"torch=={torch}"], check=True)
        check_torch(python, torch, "torch")
        subprocess.run([*install, ROOT], check=True)
        check_torch(python, torch, "dataecho")
        (venv / "torch.txt").write_text(f"torch=={torch}\n")  # the tools must take this torch
        subprocess.run([*install, "-c", venv / "torch.txt", *tool_requirements()], check=True)
        check_torch(python, torch, "the test tools")
        return subprocess.run([venv / "bin" / "pytest", *PYTEST], cwd=ROOT).returncode
    finally:
        shutil.rmtree(venv)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1]:
        sys.exit("usage: python scripts/compat.py TORCH_VERSION (make compat TORCH=2.9.1)")
    sys.exit(main(sys.argv[1]))
