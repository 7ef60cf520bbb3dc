"""timm's own ``train.py`` with an EchoingDataLoader for training, resumed at an epoch boundary.

    python scripts/timm_check.py --timm-repo PATH [--timm-rev REV] [--venv PATH]
    python scripts/timm_check.py --train-py FILE [--timm VERSION] [--venv PATH]

What it proves, on a real training script and real images (Fashion-MNIST):

- The training loader of timm's ``train.py`` can be swapped for ``dataecho.EchoingDataLoader``
  by one added line (and its import): timm's dataset keeps its train transform as a
  ``transform`` attribute, which the loader lifts off and runs on each echoed copy.
- ``train.py`` runs to the end: every epoch delivers ``len(loader)`` full batches, each example
  of the subset twice (``echo_factor=2``), each copy augmented on its own (no two input tensors
  of an epoch are the same).
- ``train.py --resume`` continues the data stream: ``train.py`` calls ``set_epoch`` on
  ``loader.batch_sampler`` before each epoch, and an EchoingDataLoader seeded with
  ``seed=args.seed`` then draws that epoch's order and augmentations. A run stopped after
  ``--stop-after`` epochs and resumed from its last checkpoint feeds the model, batch for batch,
  the same tensors (labels and augmented pixels) as the run that was not stopped, and each
  later epoch's order differs from epoch 0's.

How:

1. A throwaway venv (or ``--venv PATH``, kept): ``torch==2.14.1 torchvision==0.29.1`` (timm
   needs torchvision; these run on the CPU), timm ``--timm`` (default 1.0.29, the first release
   whose ``train.py`` calls ``set_epoch`` outside distributed runs), and this checkout,
   installed from a copy so that nothing is built inside the checkout. Plain
   ``python3.11 -m venv`` and pip, which read the machine's pip configuration (local wheels).
2. ``train.py``, which timm's wheel does not ship: from ``--train-py FILE``, else from the timm
   sdist on PyPI if it ships one (1.0.29 to 1.0.31 do not), else ``git show REV:train.py`` in
   ``--timm-repo`` (a clone of huggingface/pytorch-image-models; REV defaults to the tag
   ``v<--timm>``). Nothing is fetched but from PyPI.
3. The patch (see ``PATCH``): each anchor must be found exactly once, else the check stops,
   saying which.
4. The runs go through this file's ``_train`` mode, which records what the training loader
   delivers (labels and a digest of each batch) and every ``set_epoch`` call, then runs
   ``train.py`` unchanged otherwise (``runpy``). Three runs: ``--epochs`` epochs; the same
   stopped after ``--stop-after`` epochs; that one resumed from its ``last.pth.tar``.
5. A summary; the exit status is non-zero on any failure. The temporary folder (data, runs,
   venv) is deleted unless ``--keep``; a ``--venv`` given is never deleted.

The CPU is enough: a 4.9M-parameter resnet10t on 32x32 images, 512 training and 128 validation
images, takes a few seconds an epoch.
"""

from __future__ import annotations

import argparse
import collections
import csv
import difflib
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
TORCH = ["torch==2.14.1", "torchvision==0.29.1"]
BATCH_SIZE = 32
ECHO_FACTOR = 2

# (anchor, replacement): each anchor must occur exactly once in train.py. The training loader
# timm built is kept for what create_loader did to the dataset (it set dataset.transform to the
# train transform); the EchoingDataLoader replaces it before anything else reads it.
ECHO_LOADER = (
    "    loader_train = dataecho.EchoingDataLoader(dataset_train, batch_size=args.batch_size,"
    " shuffle=True, drop_last=True, echo_factor=2, num_workers=args.workers, seed=args.seed)\n"
)
PATCH = [
    ("import torch.nn as nn\n", "import torch.nn as nn\nimport dataecho\n"),
    ("    loader_eval = None\n", ECHO_LOADER + "    loader_eval = None\n"),
]


class CheckFailed(Exception):
    pass


def say(msg: str) -> None:
    print(f"timm_check: {msg}", flush=True)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


# --- set-up (this Python, standard library only) ---------------------------------------------


def python311() -> str:
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        raise CheckFailed("needs Python 3.11 (the torch wheels on this disk are for 3.11)")
    return found


def venv_version(python: Path, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def build_venv(venv: Path, timm: str, fresh: bool, tmp: Path) -> Path:
    python = venv / "bin" / "python"
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if fresh:
        say(f"building a venv in {venv} (torch and torchvision: several GB, a few minutes)")
        run([python311(), "-m", "venv", venv])
        run([*pip, *TORCH])
    # A copy of the checkout: pip builds in the source folder, and the checkout is not ours.
    src = tmp / "dataecho-src"
    shutil.copytree(ROOT / "dataecho", src / "dataecho",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    run([*pip, f"timm=={timm}", src])  # with dataecho's dependencies
    run([*pip, "--force-reinstall", "--no-deps", src])  # the checkout as it is now
    for package, wanted in (("torch", TORCH[0]), ("torchvision", TORCH[1])):
        found = venv_version(python, package)
        if fresh and found != wanted.split("==")[1]:
            raise CheckFailed(f"the venv has {package} {found}, not {wanted}")
    return python


def train_py_from_sdist(python: Path, timm: str, tmp: Path) -> str | None:
    """timm's train.py from its source distribution on PyPI, if the sdist ships it."""
    dest = tmp / "sdist"
    got = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                          ":all:", "-d", dest, f"timm=={timm}"],
                         capture_output=True, text=True)  # fmt: skip
    if got.returncode:
        say(f"no timm {timm} sdist: {got.stderr.strip().splitlines()[-1:]}")
        return None
    for archive in dest.glob("timm-*.tar.gz"):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.name.count("/") == 1 and member.name.endswith("/train.py"):
                    return tar.extractfile(member).read().decode()
    return None


def get_train_py(args: argparse.Namespace, python: Path, tmp: Path) -> tuple[str, str]:
    if args.train_py:
        return Path(args.train_py).read_text(), args.train_py
    text = train_py_from_sdist(python, args.timm, tmp)
    if text is not None:
        return text, f"the timm {args.timm} sdist"
    if args.timm_repo:
        rev = args.timm_rev or f"v{args.timm}"
        show = subprocess.run(["git", "-C", args.timm_repo, "show", f"{rev}:train.py"],
                              capture_output=True, text=True)  # fmt: skip
        if show.returncode:
            raise CheckFailed(f"no train.py at {rev} in {args.timm_repo}: {show.stderr.strip()}"
                              " (--timm-rev names another commit)")  # fmt: skip
        return show.stdout, f"{args.timm_repo} at {rev}"
    raise CheckFailed(
        f"the timm {args.timm} sdist has no train.py: pass --train-py FILE, or --timm-repo with a "
        "clone of huggingface/pytorch-image-models (and --timm-rev if the tag v"
        f"{args.timm} is not the train.py wanted)"
    )


def patch(text: str) -> str:
    for anchor, replacement in PATCH:
        count = text.count(anchor)
        if count != 1:
            raise CheckFailed(f"train.py has the patch's anchor {count} times, not once:\n{anchor}")
        text = text.replace(anchor, replacement)
    return text


# --- the three runs and their comparison -----------------------------------------------------


def read_record(path: Path) -> dict:
    """A run's record: the epochs the training loader delivered, in order, train.py's
    set_epoch calls, and the warnings shown."""
    rec: dict = {"epochs": [], "set_epoch": [], "warnings": []}
    if path.exists():
        for line in path.read_text().splitlines():
            item = json.loads(line)
            if item["kind"] == "epoch":
                rec["epochs"].append(item)
            elif item["kind"] == "set_epoch":
                rec["set_epoch"].append(item["epoch"])
            else:
                rec["warnings"].append(f"{item['category']}: {item['message']}")
    return rec


def train(python: Path, train_py: Path, tmp: Path, common: list[str], name: str,
          epochs: int, resume: Path | None, threads: int) -> dict:  # fmt: skip
    record = tmp / f"{name}.jsonl"
    log = tmp / f"{name}.log"
    argv = [*common, "--epochs", epochs, "--experiment", name]
    if resume is not None:
        argv += ["--resume", resume]
    cmd = [python, __file__, "_train", record, threads, train_py, *argv]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    say(f"run {name}: train.py --epochs {epochs}" + (f" --resume {resume}" if resume else ""))
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                              env=env, cwd=tmp)  # fmt: skip
    if done.returncode:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise CheckFailed(f"train.py ({name}) exited {done.returncode}; its log ends:\n{tail}")
    rec = read_record(record)
    rec["seconds"] = time.monotonic() - start
    return rec


def fail_unless(ok: bool, msg: str, failures: list[str]) -> None:
    say(("ok    " if ok else "FAIL  ") + msg)
    if not ok:
        failures.append(msg)


def compare(full: dict, part: dict, resumed: dict, epochs: int, stop: int,
            label_counts: dict[int, int]) -> list[str]:  # fmt: skip
    """The checks, each printed. A run's i-th delivered epoch is train.py's epoch
    ``expect[run][i]``: the resumed run's first is train.py's epoch ``stop``, and must be the
    full run's epoch ``stop`` batch for batch."""
    failures: list[str] = []
    expect = {"full": range(epochs), "stopped": range(stop), "resumed": range(stop, epochs)}
    wanted = {k: ECHO_FACTOR * n for k, n in label_counts.items()}
    for name, rec in (("full", full), ("stopped", part), ("resumed", resumed)):
        ran = [ep["epoch"] for ep in rec["epochs"]]
        fail_unless(ran == list(expect[name]),
                    f"{name}: train.py's epochs {list(expect[name])} ran the loader's epochs "
                    f"{ran}", failures)  # fmt: skip
        fail_unless(rec["set_epoch"] == list(expect[name]),
                    f"{name}: train.py called batch_sampler.set_epoch with {rec['set_epoch']}",
                    failures)  # fmt: skip
        for e, ep in zip(expect[name], rec["epochs"], strict=False):
            sizes = sorted(set(ep["sizes"]))
            fail_unless(ep["len"] == len(ep["digests"]) and sizes == [BATCH_SIZE],
                        f"{name} epoch {e}: len(loader) {ep['len']}, {len(ep['digests'])} "
                        f"batches iterated, batch sizes {sizes}", failures)  # fmt: skip
            fail_unless(dict(collections.Counter(ep["labels"])) == wanted,
                        f"{name} epoch {e}: each example delivered {ECHO_FACTOR} times "
                        "(labels counted)", failures)  # fmt: skip
            fail_unless(ep["distinct"] == ep["images"],
                        f"{name} epoch {e}: {ep['distinct']} distinct input tensors of "
                        f"{ep['images']} not of one colour (each copy augmented on its own)",
                        failures)  # fmt: skip
    fe = full["epochs"]
    for e in range(1, min(epochs, len(fe))):
        fail_unless(fe[e]["labels"] != fe[0]["labels"]
                    and not set(fe[e]["digests"]) & set(fe[0]["digests"]),
                    f"full: epoch {e}'s order and batches differ from epoch 0's",
                    failures)  # fmt: skip
    for name, rec in (("stopped", part), ("resumed", resumed)):
        for e, ep in zip(expect[name], rec["epochs"], strict=False):
            same = e < len(fe) and ep["digests"] == fe[e]["digests"]
            fail_unless(same, f"{name} epoch {e}: the same batches (labels and augmented "
                        f"pixels) as the uninterrupted run's epoch {e}", failures)  # fmt: skip
    return failures


def same_losses(out: Path, stop: int, epochs: int) -> str:
    """Whether the resumed run's training losses (train.py's summary.csv) are the full run's:
    the model sees the same batches, so on the CPU they usually are, to the last digit."""
    loss = {}
    for name in ("full", "resumed"):
        with (out / name / "summary.csv").open() as f:
            loss[name] = {int(r["epoch"]): r["train_loss"] for r in csv.DictReader(f)}
    resumed = [loss["resumed"].get(e) for e in range(stop, epochs)]
    full = [loss["full"].get(e) for e in range(stop, epochs)]
    verdict = "the same as" if resumed == full else "not the same as"
    return f"the resumed epochs' train losses {resumed} are {verdict} the full run's {full}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", help="use (and keep) this venv, made if missing")
    parser.add_argument("--timm", default="1.0.29", help="the timm release to install")
    parser.add_argument("--train-py", help="timm's train.py, as a file")
    parser.add_argument("--timm-repo", help="a git clone of huggingface/pytorch-image-models")
    parser.add_argument("--timm-rev", help="the commit of --timm-repo (default: tag v<--timm>)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--stop-after", type=int, default=1, help="epochs before the resume")
    parser.add_argument("--workers", type=int, default=0, help="train.py --workers")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--train-images", type=int, default=512)
    parser.add_argument("--val-images", type=int, default=128)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    if not 0 < args.stop_after < args.epochs:
        parser.error("needs 0 < --stop-after < --epochs")
    if args.train_images % BATCH_SIZE:
        parser.error(f"--train-images must be a multiple of {BATCH_SIZE}")

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="dataecho-timm-"))
    fresh = args.venv is None or not (Path(args.venv) / "bin" / "python").exists()
    venv = Path(args.venv) if args.venv else tmp / "venv"
    try:
        python = build_venv(venv, args.timm, fresh, tmp)
        versions = {p: venv_version(python, p) for p in ("torch", "torchvision", "timm")}
        say("versions: " + ", ".join(f"{p} {v}" for p, v in versions.items()))
        text, source = get_train_py(args, python, tmp)
        say(f"train.py from {source}")
        train_py = tmp / "train_echo.py"
        train_py.write_text(patch(text))
        diff = difflib.unified_diff(text.splitlines(), train_py.read_text().splitlines(),
                                    "train.py", "train.py (patched)", n=0, lineterm="")  # fmt: skip
        print("\n".join(diff), flush=True)

        data = tmp / "data"
        run([python, __file__, "_data", data, args.train_images, args.val_images])
        label_counts = {int(d.name): len(list(d.iterdir())) for d in (data / "train").iterdir()}
        common = [
            "--data-dir", data, "--model", "resnet10t", "--num-classes", 10, "--img-size", 32,
            "--batch-size", BATCH_SIZE, "--workers", args.workers, "--device", "cpu",
            "--no-prefetcher", "--opt", "sgd", "--lr", 0.05, "--warmup-epochs", 0,
            "--seed", 0, "--log-interval", 8, "--checkpoint-hist", 1, "--output", tmp / "out",
        ]  # fmt: skip
        run_args = (python, train_py, tmp, [str(c) for c in common])
        full = train(*run_args, "full", args.epochs, None, args.threads)
        part = train(*run_args, "stopped", args.stop_after, None, args.threads)
        last = tmp / "out" / "stopped" / "last.pth.tar"
        if not last.exists():
            raise CheckFailed(f"the stopped run left no {last}")
        resumed = train(*run_args, "resumed", args.epochs, last, args.threads)

        failures = compare(full, part, resumed, args.epochs, args.stop_after, label_counts)
        say(f"for information: {same_losses(tmp / 'out', args.stop_after, args.epochs)}")
        warned = sorted({w for r in (full, part, resumed) for w in r["warnings"]})
        for w in warned:
            say(f"warning seen: {w}")
        seconds = {n: round(r["seconds"], 1) for n, r in
                   (("full", full), ("stopped", part), ("resumed", resumed))}  # fmt: skip
        say(f"train.py seconds per run: {seconds}; total {time.monotonic() - started:.0f} s")
        if failures:
            say(f"FAILED: {len(failures)} check(s)")
            return 1
        say(f"PASSED: timm {versions['timm']} train.py with EchoingDataLoader, {args.epochs} "
            f"epochs, resumed after {args.stop_after}: same batches as without the stop")  # fmt: skip
        return 0
    except (CheckFailed, subprocess.CalledProcessError) as exc:
        say(f"FAILED: {exc}")
        return 1
    finally:
        if args.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --- modes run inside the venv -----------------------------------------------------------------


def idx(path: Path) -> tuple[tuple[int, ...], bytes]:
    with gzip.open(path) as f:
        raw = f.read()
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    return shape, raw[4 + 4 * ndim :]


def make_data(root: Path, n_train: int, n_val: int) -> None:
    """An image folder timm reads: root/{train,validation}/<label>/<i>.png, from the first
    images of Fashion-MNIST's training and test files."""
    from PIL import Image

    for split, prefix, n in (("train", "train", n_train), ("validation", "t10k", n_val)):
        (_, rows, cols), pixels = idx(FASHION_MNIST / f"{prefix}-images-idx3-ubyte.gz")
        _, labels = idx(FASHION_MNIST / f"{prefix}-labels-idx1-ubyte.gz")
        size = rows * cols
        for i in range(n):
            folder = root / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            img = Image.frombytes("L", (cols, rows), pixels[i * size : (i + 1) * size])
            img.save(folder / f"{i:05d}.png")


def run_train(record: Path, threads: int, train_py: Path, argv: list[str]) -> None:
    """train.py in this process, with the training loader's output and set_epoch calls
    recorded, one JSON line each, and dataecho's warnings (IdenticalCopiesWarning an error)."""
    import hashlib
    import runpy
    import warnings

    import torch

    import dataecho
    from dataecho.loader.echoing_loader import EpochHook

    torch.set_num_threads(threads)
    out = record.open("a")

    def write(**item: object) -> None:
        out.write(json.dumps(item) + "\n")
        out.flush()

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        write(kind="warning", category=category.__name__, message=str(message))
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.filterwarnings("error", category=dataecho.IdenticalCopiesWarning)

    loader_iter = dataecho.EchoingDataLoader.__iter__
    hook_set_epoch = EpochHook.set_epoch

    def recording_iter(self):
        length = len(self)
        labels, digests, sizes, inputs = [], [], [], []
        for batch in loader_iter(self):
            x, y = batch[0], batch[1]
            labels += y.tolist()
            sizes.append(len(y))
            h = hashlib.sha256(x.contiguous().numpy().tobytes())
            h.update(y.numpy().tobytes())
            digests.append(h.hexdigest()[:16])
            for row in x.flatten(2):  # a crop of the black background is one colour: skipped
                if not torch.equal(row.amax(1), row.amin(1)):
                    inputs.append(hashlib.sha256(row.numpy().tobytes()).digest())
            yield batch
        write(kind="epoch", epoch=self.epoch, len=length, labels=labels, digests=digests,
              sizes=sizes, images=len(inputs), distinct=len(set(inputs)))  # fmt: skip

    def recording_set_epoch(self, epoch):
        write(kind="set_epoch", epoch=epoch)
        hook_set_epoch(self, epoch)

    dataecho.EchoingDataLoader.__iter__ = recording_iter
    EpochHook.set_epoch = recording_set_epoch
    sys.argv = [str(train_py), *argv]
    runpy.run_path(str(train_py), run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_data":
        make_data(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_train":
        run_train(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:])
    else:
        sys.exit(main())
