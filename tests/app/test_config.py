"""TrainConfig: per-workload defaults, every check's message, TOML files, flag overrides."""

from __future__ import annotations

import argparse
import dataclasses
import re
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataecho._validate import CPU_COUNT, MAX_BATCH, MAX_BUFFER, MAX_WORKERS
from dataecho.app import workloads
from dataecho.app.config import (
    MAX_AUGMENT_PAD,
    MAX_KEEP_CHECKPOINTS,
    MAX_NPROC,
    MAX_SEED,
    MAX_SEQ_LEN,
    TrainConfig,
)
from dataecho.app.config_file import ConfigError, config_from, flag, options, read_toml
from dataecho.app.loader_settings import LOADER_KEYS
from dataecho.app.sources.austen import DEFAULT_PACKAGE_DIR
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR
from dataecho.errors import DataechoError
from dataecho.loader import LoaderOptions


@pytest.mark.parametrize("workload", ["cnn", "char-lm"])
def test_none_means_the_workloads_default(workload):
    cfg = TrainConfig(workload=workload)
    for key, value in workloads.get(workload).defaults.items():
        assert getattr(cfg, key) == value, key
    assert cfg.data_dir == (DEFAULT_DATA_DIR if workload == "cnn" else DEFAULT_PACKAGE_DIR)
    assert cfg.target is None and cfg.name == "e=1"


def test_given_values_are_kept_and_normalised():
    cfg = TrainConfig(batch_size=7, lr=1, echo_factor=3, data_dir="some/dir", checkpoint_dir="ck")
    assert cfg.batch_size == 7 and cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.echo_factor == 3.0 and cfg.name == "e=3"
    assert cfg.data_dir == Path("some/dir") and cfg.checkpoint_dir == Path("ck")
    assert TrainConfig(echo_factor="auto").name == "auto"
    assert TrainConfig(upstream="memory").upstream is None
    assert TrainConfig(workload="char-lm", target_loss=2).target == 2.0


def test_to_dict_is_plain_and_rebuilds_the_same_config():
    cfg = TrainConfig(echo_factor="auto", checkpoint_dir=Path("ck"), upstream="http://h:1")
    plain = cfg.to_dict()
    assert plain["checkpoint_dir"] == "ck" and plain["echo_factor"] == "auto"
    assert all(isinstance(v, (str, int, float, bool, type(None))) for v in plain.values())
    assert TrainConfig(**plain) == cfg


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"budget": 0}, ValueError, "budget must be >= 1 or 'default', got 0"),
        ({"threads": 0}, ValueError, "threads must be >= 1, got 0"),
        ({"threads": 1.5}, TypeError, r"threads must be an integer in 1\.\.1024, got 1.5"),
        ({"shuffle_buffer": -1}, ValueError, "shuffle_buffer must be >= 0( or 'default')?, got -1"),
        ({"echo_factor": 0.5}, ValueError, "echo_factor must be >= 1"),
        ({"echo_factor": "twice"}, TypeError, 'or "auto"'),
        ({"where": "middle"}, ValueError, "where must be one of 'before_augment'"),
        ({"workload": "gpt"}, ValueError, "workload must be one of 'cnn', 'char-lm', got 'gpt'"),
        ({"lr": 0}, ValueError, "lr must be a number in \\(0, 10\\] or 'default', got 0"),
        ({"momentum": 1.0}, ValueError, r"momentum must be a number in \[0, 1\), got 1.0"),
        ({"target_accuracy": 1.2}, ValueError, r"target_accuracy must be a number in \(0, 1\]"),
        ({"read_delay": float("inf")}, ValueError, r"read_delay must be a number in \[0, 3600\]"),
        ({"resume": 1}, TypeError, "resume must be true or false, got 1"),
        ({"upstream": "ftp://host/x"}, ValueError, "upstream must be 'memory', http://HOST"),
        ({"upstream": "http:///nohost"}, ValueError, "got 'http:///nohost'"),
        ({"resume": True}, ValueError, "resume=True needs checkpoint_dir"),
        ({"target_loss": 2.0}, ValueError, "target_loss=2.0 does not apply to workload='cnn'"),
        (
            {"upstream": "shards/", "read_delay": 0.001},
            ValueError,
            "read_delay=0.001 applies to the in-memory upstream only",
        ),
    ],
)
def test_bad_values_name_the_key_the_value_and_the_range(changes, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**changes)


# Values past what the machinery takes (a C integer, time.sleep, a socket timeout) or what any
# run needs: refused when the config is built, with the range and the reason, not deep inside
# a run (an overflow traceback, or a loader that queues 2 x e batches and never answers).
@pytest.mark.parametrize(
    ("flag_name", "text", "message"),
    [
        ("seed", "18446744073709551616",
         r"--seed: seed must be an integer in 0\.\.18446744073709551615, got "
         r"18446744073709551616 \(2\*\*64 - 1: torch.manual_seed takes a 64-bit unsigned seed; "
         r"pass the seed modulo 2\*\*64"),
        ("read_delay", "1.8e19",
         r"--read-delay: read_delay must be a number in \[0, 3600\], got 1.8e\+19 \(seconds each "
         r"read sleeps: an hour per read is slower than any storage worth emulating; e.g. "
         r"read_delay=0.0006"),
        ("echo_factor", "18446744073709551616",
         r"--echo-factor: echo_factor must be at most 1024, got 1.8446744073709552e\+19: each "
         r"fresh item is emitted that many times, .* use echo_factor=2 to 16 \(the papers' "
         r"range\) or echo_factor='auto'"),
        ("echo_factor", "1024.5", "echo_factor must be at most 1024, got 1024.5"),
        ("max_echo_factor", "2000",
         r"max_echo_factor must be a number in \[1, 1024\], got 2000.0 \(the most times one "
         r"fresh item is emitted"),
        ("http_timeout", "1e19", r"http_timeout must be a number in \(0, 86400\], got 1e\+19"),
        ("dist_timeout", "1e19", r"dist_timeout must be a number in \(0, 86400\], got 1e\+19"),
        ("threads", str(2**40), r"threads must be an integer in 1\.\.1024, got 1099511627776"),
    ],
)  # fmt: skip
def test_values_past_their_limit_are_refused_with_the_range_and_the_reason(
    flag_name, text, message
):
    with pytest.raises(ConfigError, match=message):
        config_from(None, {flag_name: text})


def test_the_limits_themselves_are_accepted():
    cfg = TrainConfig(seed=2**64 - 1, read_delay=3600, echo_factor=1024, max_echo_factor=1024,
                      http_timeout=86_400, dist_timeout=86_400, threads=1024)  # fmt: skip
    assert cfg.seed == 2**64 - 1 and cfg.read_delay == 3600.0 and cfg.echo_factor == 1024.0
    with pytest.raises(ValueError, match="echo_factor must be at most 1024"):
        TrainConfig(echo_factor=float(2**64))
    with pytest.raises(ValueError, match=r"seed must be an integer in 0\.\.18446744073709551615"):
        TrainConfig(seed=2**64)
    with torch.random.fork_rng(devices=[]):  # the limit is torch's own: one more overflows it
        torch.manual_seed(MAX_SEED)
        with pytest.raises((RuntimeError, ValueError), match="Overflow"):
            torch.manual_seed(MAX_SEED + 1)


def test_target_accuracy_does_not_apply_to_the_language_model():
    with pytest.raises(ValueError, match="set target_loss instead"):
        TrainConfig(workload="char-lm", target_accuracy=0.8)


def test_every_option_has_a_check_a_group_and_help():
    for f in options():
        assert {"check", "group", "help"} <= set(f.metadata), f.name
        assert len(f.metadata["help"]) > 10, f.name
    assert flag("echo_factor") == "--echo-factor"


def test_toml_keys_as_flags_or_fields_and_flags_override(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'workload = "cnn"\necho-factor = 4\nshuffle_buffer = 1280\nupstream = "shards/"\n'
        'target-accuracy = 0.8\nresume = false\ncheckpoint-dir = "ck"\n'
    )
    assert read_toml(path)["echo_factor"] == 4
    cfg = config_from(path, {"echo_factor": "auto", "batch_size": "64", "resume": True})
    assert cfg.echo_factor == "auto" and cfg.shuffle_buffer == 1280 and cfg.batch_size == 64
    assert cfg.upstream == "shards/" and cfg.target_accuracy == 0.8 and cfg.resume is True
    assert cfg.checkpoint_dir == Path("ck")


def test_unknown_toml_key_suggests_the_closest(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("echo_factr = 2\n")
    with pytest.raises(ConfigError, match=r"run.toml: unknown key 'echo_factr'; did you mean"):
        config_from(path)
    path.write_text("zzz = 2\n")
    with pytest.raises(ConfigError, match="valid keys: workload, data_dir"):
        config_from(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("budget = 0", "run.toml: key 'budget': budget must be >= 1 or 'default', got 0"),
        ('budget = "lots"', "key 'budget': must be an integer in 1..9007199254740992, got 'lots'"),
        ("momentum = 1.5", r"key 'momentum': momentum must be a number in \[0, 1\), got 1.5"),
        ('where = "mid"', "key 'where': where must be one of"),
        ("progress = 1", "key 'progress': progress must be true or false, got 1"),
        ("budget = ", "not a readable TOML file"),
    ],
)
def test_bad_toml_values_name_the_file_key_value_and_range(tmp_path, text, message):
    path = tmp_path / "run.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=message):
        config_from(path)


def test_missing_config_file_and_bad_flags(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.toml"):
        config_from(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="--budget: budget must be >= 1 or 'default', got 0"):
        config_from(None, {"budget": "0"})
    with pytest.raises(ConfigError, match="--echo-factor: must be a number >= 1 or 'auto'"):
        config_from(None, {"echo_factor": "lots"})
    with pytest.raises(ConfigError, match="target_loss=2.0 does not apply"):
        config_from(None, {"target_loss": "2"})


def test_flag_text_off_none_auto_and_booleans():
    cfg = config_from(None, {"max_steps": "off", "echo_factor": "auto", "stop_at_target": "no",
                             "upstream": "memory", "budget": "60_000"})  # fmt: skip
    assert cfg.max_steps is None and cfg.echo_factor == "auto" and cfg.stop_at_target is False
    assert cfg.upstream is None and cfg.budget == 60_000
    lm = config_from(None, {"workload": "char-lm", "batch_size": "default", "lr": "default"})
    assert lm.batch_size == 32 and lm.lr == 3e-3
    with pytest.raises(
        ConfigError, match="--max-steps: must be an integer in 1..9007199254740992, got 'default'"
    ):
        config_from(None, {"max_steps": "default"})  # for max_steps None means "no limit"


@pytest.mark.parametrize("workload", ["cnn", "char-lm"])
def test_cli_targets_apply_only_where_no_target_is_given(workload, tmp_path):
    key, target = workloads.get(workload).target_key, workloads.get(workload).cli_target
    assert getattr(config_from(None, {"workload": workload}, cli_targets=True), key) == target
    off = config_from(None, {"workload": workload, key: "off"}, cli_targets=True)
    assert getattr(off, key) is None
    path = tmp_path / "run.toml"
    path.write_text(f'workload = "{workload}"\n{key} = 0.5\n')
    assert getattr(config_from(path, cli_targets=True), key) == 0.5
    assert getattr(config_from(None, {"workload": workload}), key) is None


def test_defaults_rank_below_the_file_and_the_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("progress = false\n")
    assert config_from(None, defaults={"progress": True}).progress is True
    assert config_from(path, defaults={"progress": True}).progress is False
    assert config_from(path, {"progress": True}, defaults={"progress": False}).progress is True


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 10_000),
    buffer=st.integers(0, 10_000),
    factor=st.one_of(st.just("auto"), st.floats(1, 16, allow_nan=False)),
    lr=st.floats(1e-6, 10, allow_nan=False),
)
def test_flags_as_text_give_the_same_config_as_python_values(batch, buffer, factor, lr):
    text = {"batch_size": str(batch), "shuffle_buffer": str(buffer), "echo_factor": str(factor),
            "lr": repr(lr)}  # fmt: skip
    want = TrainConfig(batch_size=batch, shuffle_buffer=buffer, echo_factor=factor, lr=lr)
    assert config_from(None, text) == want
    assert dataclasses.replace(want) == want


def test_the_loader_settings_are_one_nested_field_read_flat_as_well():
    cfg = TrainConfig(echo_factor=4, shuffle_buffer=256, read_delay=0.001)
    assert isinstance(cfg.loader, LoaderOptions)
    assert cfg.loader == LoaderOptions(batch_size=128, echo_factor=4, shuffle_buffer=256)
    assert cfg == TrainConfig(loader=LoaderOptions(batch_size=128, echo_factor=4,
                                                   shuffle_buffer=256), read_delay=0.001)  # fmt: skip
    for name in LOADER_KEYS:
        assert getattr(cfg, name) == getattr(cfg.loader, name), name
    # Flat keywords apply over a given loader; the batch size defaults per workload only when
    # neither gives one.
    over = TrainConfig(loader=LoaderOptions(batch_size=8, echo_factor=2), where="batch")
    assert (over.batch_size, over.echo_factor, over.where) == (8, 2.0, "batch")
    assert TrainConfig(workload="char-lm", echo_factor=2).loader.batch_size == 32


def test_replace_derives_the_loaders_defaults_again():
    cfg = TrainConfig(echo_factor="auto")
    assert cfg.reuse_buffer == 128 and cfg.reuse_policy == "fewest"
    batches = dataclasses.replace(cfg, where="batch")
    assert batches.reuse_buffer == 1 and batches.reuse_policy == "latest"
    assert dataclasses.replace(cfg, batch_size=64).reuse_buffer == 64
    fixed = dataclasses.replace(cfg, echo_factor=2.0)
    assert fixed.read_ahead == 128 and fixed.name == "auto"  # a given name stays as given
    assert dataclasses.replace(cfg, reuse_buffer=7).reuse_buffer == 7


def test_the_loader_options_help_and_checks_come_from_loader_options():
    own = {f.name: f for f in dataclasses.fields(LoaderOptions)}
    loader_options = {o.name: o for o in options() if o.name in LOADER_KEYS}
    assert list(loader_options) == list(LOADER_KEYS)
    for name, option in loader_options.items():
        assert option.help.startswith(own[name].metadata["help"]), name
    assert "(default: 128 for cnn, 32 for char-lm)" in loader_options["batch_size"].help
    assert loader_options["shuffle_buffer"].check is own["shuffle_buffer"].metadata["check"]
    # The library takes any echo factor; a run refuses one no run needs, given either way.
    assert LoaderOptions(batch_size=8, echo_factor=2000).echo_factor == 2000.0
    with pytest.raises(ValueError, match="echo_factor must be at most 1024, got 2000"):
        TrainConfig(loader=LoaderOptions(batch_size=8, echo_factor=2000))
    with pytest.raises(ValueError, match="loader.transform=.*takes transform from the workload"):
        TrainConfig(loader=LoaderOptions(batch_size=8, transform=abs))
    with pytest.raises(TypeError, match="loader must be a dataecho.loader.LoaderOptions"):
        TrainConfig(loader={"echo_factor": 2})
    with pytest.raises(TypeError, match="unexpected keyword argument 'echo_factr'; did you mean"):
        TrainConfig(echo_factr=2)


def test_a_resume_compares_the_loaders_settings():
    from dataecho.app.checkpoint_file import CheckpointError, check_same
    from dataecho.app.training.save_resume import RESUME_MUST_MATCH

    saved = TrainConfig(echo_factor=2, where="after_augment", shuffle_buffer=64).to_dict()
    assert set(LOADER_KEYS) <= set(saved)  # flat, where check_same looks for them
    assert {"echo_factor", "where", "shuffle_buffer", "batch_size"} <= set(RESUME_MUST_MATCH)
    check_same(saved, TrainConfig(**saved).to_dict(), RESUME_MUST_MATCH, "ck.pt")
    for change in ({"echo_factor": 3}, {"where": "batch"}, {"shuffle_buffer": 0},
                   {"batch_size": 64}, {"max_echo_factor": 8}):  # fmt: skip
        (key,) = change
        with pytest.raises(CheckpointError, match=f"{key}: checkpoint"):
            check_same(saved, TrainConfig(**{**saved, **change}).to_dict(), RESUME_MUST_MATCH,
                       "ck.pt")  # fmt: skip


def test_a_toml_loader_table_is_read_as_flat_keys(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('workload = "cnn"\n[loader]\necho-factor = 3\nshuffle_buffer = 64\n')
    cfg = config_from(path)
    assert cfg.echo_factor == 3.0 and cfg.loader.shuffle_buffer == 64
    path.write_text("echo_factor = 2\n[loader]\necho_factor = 3\n")
    with pytest.raises(ConfigError, match="key 'echo_factor' is given twice"):
        config_from(path)
    path.write_text("[loader]\nlr = 3\n")
    with pytest.raises(ConfigError, match="unknown key 'loader.lr': lr is a setting of the run"):
        config_from(path)
    path.write_text("[loader]\necho_factr = 3\n")
    with pytest.raises(ConfigError, match="unknown key 'loader.echo_factr'; did you mean 'echo_"):
        config_from(path)


def test_a_bad_value_reads_the_same_from_python_a_flag_a_file_and_argparse(tmp_path):
    with pytest.raises(ValueError) as python:
        TrainConfig(shuffle_buffer=-1)
    message = str(python.value)
    assert message.startswith("shuffle_buffer must be >= 0")
    assert "got -1; use 0 for no post-echo shuffling" in message
    with pytest.raises(ConfigError) as from_flag:
        config_from(None, {"shuffle_buffer": "-1"})
    assert str(from_flag.value) == f"--shuffle-buffer: {message}"
    path = tmp_path / "run.toml"
    path.write_text("shuffle-buffer = -1\n")
    with pytest.raises(ConfigError) as from_file:
        config_from(path)
    assert str(from_file.value) == f"{path}: key 'shuffle-buffer': {message}"
    option = next(o for o in options() if o.name == "shuffle_buffer")
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(message)}$"):
        option.check.argparse_type("shuffle_buffer")("-1")
    assert issubclass(ConfigError, DataechoError) and issubclass(ConfigError, ValueError)


def test_the_training_device_is_a_run_setting_read_from_python_flags_and_toml(tmp_path):
    assert TrainConfig().device is None  # CUDA where it is available, else the CPU: at the run
    assert TrainConfig(device=torch.device("cpu")).device == "cpu"
    assert config_from(None, {"device": "cuda:1"}).device == "cuda:1"
    assert config_from(None, {"device": "default"}).device is None
    # Any insertion point: the device is where the step runs, not only where device echoes.
    assert config_from(None, {"device": "cuda", "where": "before_augment"}).device == "cuda"
    path = tmp_path / "run.toml"
    path.write_text('device = "cpu"\nwhere = "batch"\n')
    assert (config_from(path).device, config_from(path).where) == ("cpu", "batch")
    option = next(o for o in options() if o.name == "device")
    assert option.group == "machine" and "device" not in LOADER_KEYS
    assert TrainConfig(**TrainConfig(device="cuda").to_dict()).device == "cuda"


@pytest.mark.parametrize(
    ("where", "text", "message"),
    [
        ("flag", "gpu", r"--device: device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'; pass "
         r"e.g. device='cuda'"),
        ("flag", "mps", r"--device: device must be 'cpu', 'cuda' or 'cuda:N', got 'mps': a run "
         r"trains on the CPU or a CUDA GPU"),
        ("toml", "device = 0", r"run.toml: key 'device': device must be 'cpu', 'cuda' or "
         r"'cuda:N' \(or a torch.device\), got 0 of type int"),
        ("toml", '[loader]\ndevice = "cpu"', r"unknown key 'loader.device': device is a setting "
         r"of the run, not of its loader"),
    ],
)  # fmt: skip
def test_a_bad_device_names_the_flag_or_key_the_value_and_the_choices(tmp_path, where, text,
                                                                        message):  # fmt: skip
    path = tmp_path / "run.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=message):
        config_from(None, {"device": text}) if where == "flag" else config_from(path)


def test_the_loaders_device_comes_from_the_runs():
    message = (
        r"loader.echo_device='cpu': .* from the run's device setting; pass device= \(--device\)"
    )
    with pytest.raises(ValueError, match=message):
        TrainConfig(loader=LoaderOptions(batch_size=8, where="device", echo_device="cpu"))
    # Its derived default (the CPU, for where="device") is no setting of the user's.
    cfg = TrainConfig(loader=LoaderOptions(batch_size=8, where="device"), device="cpu")
    assert cfg.where == "device" and cfg.device == "cpu"


# Every count of a run with its ceiling: above it a run would start that many processes or
# hold that many items (and hang, its memory growing) instead of failing.
COUNT_CEILINGS = {
    "num_workers": MAX_WORKERS,
    "nproc": MAX_NPROC,
    "keep_checkpoints": MAX_KEEP_CHECKPOINTS,
    "shuffle_buffer": MAX_BUFFER,
    "reuse_buffer": MAX_BUFFER,
    "read_ahead": MAX_BUFFER,
    "batch_size": MAX_BATCH,
    "seq_len": MAX_SEQ_LEN,
    "augment_pad": MAX_AUGMENT_PAD,
}


@pytest.mark.parametrize("name", COUNT_CEILINGS)
@pytest.mark.parametrize("above", ["2**64", "ceiling+1"])
def test_every_count_past_its_ceiling_is_refused_at_once_with_the_range(name, above):
    ceiling = COUNT_CEILINGS[name]
    value = 2**64 if above == "2**64" else ceiling + 1
    low = 0 if name in ("num_workers", "shuffle_buffer", "read_ahead", "augment_pad") else 1
    start = time.perf_counter()
    for text in (str(value), f"{value:_}"):  # a flag's text, with or without separators
        with pytest.raises(ConfigError) as info:
            config_from(None, {name: text})
        message = str(info.value)
        assert message.startswith(f"{flag(name)}: {name} must be an integer in {low}..{ceiling}")
        assert f"got {value} (" in message and message.count(")") >= 1, message
    with pytest.raises(ValueError, match=rf"{name} must be an integer in {low}\.\.{ceiling}"):
        TrainConfig(**{name: value})
    assert time.perf_counter() - start < 1.0  # checked up front: nothing started or allocated


def test_machine_bound_ceilings_name_the_cpu_count():
    for name in ("num_workers", "nproc"):
        with pytest.raises(ValueError) as info:
            TrainConfig(**{name: 2**64})
        assert f"this machine has {CPU_COUNT} CPU cores, os.cpu_count()" in str(info.value)
    assert MAX_WORKERS == max(32, 8 * CPU_COUNT) and MAX_NPROC == 2 * CPU_COUNT


def test_each_count_ceiling_itself_is_accepted():
    for name, ceiling in COUNT_CEILINGS.items():
        cfg = TrainConfig(**{name: ceiling})
        assert getattr(cfg, name) == ceiling, name
    cfg = config_from(None, {"num_workers": str(MAX_WORKERS), "keep_checkpoints": "1_000"})
    assert cfg.num_workers == MAX_WORKERS and cfg.keep_checkpoints == MAX_KEEP_CHECKPOINTS


def test_a_toml_count_past_its_ceiling_names_the_file_and_key(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f"keep-checkpoints = {2**63 - 1}\n")
    with pytest.raises(ConfigError, match=r"keep_checkpoints must be an integer in 1\.\.1000"):
        config_from(path, {})


def test_a_run_on_the_device_mixes_through_its_default_pool_unless_told_otherwise():
    from dataecho.app.loader_settings import DEVICE_POOL_BATCHES

    assert config_from(None, {"where": "device"}).loader.shuffle_buffer == DEVICE_POOL_BATCHES * 128
    assert TrainConfig(where="device", batch_size=64).loader.shuffle_buffer == (
        DEVICE_POOL_BATCHES * 64
    )
    assert config_from(None, {"where": "device", "shuffle_buffer": "0"}).loader.shuffle_buffer == 0
    # On the host, the loader's own default: copies spread over 10 batches where echoed.
    host = TrainConfig(where="before_augment", echo_factor=2, batch_size=64).loader
    assert host.shuffle_buffer == 640
    assert TrainConfig(where="batch", echo_factor=2).loader.shuffle_buffer == 0
    assert TrainConfig(where="device", shuffle_buffer=256).loader.shuffle_buffer == 256
    text = " ".join(next(o for o in options() if o.name == "shuffle_buffer").help.split())
    assert (
        f"(default: {DEVICE_POOL_BATCHES} batches' worth with where=device, else the loader's"
        in text
    )


# --- values of the wrong shape, counts and rates without a ceiling before ----------------------


@pytest.mark.parametrize("name", [o.name for o in options()])
@pytest.mark.parametrize(("toml", "kind"), [("[1, 2]", "an array"), ("{ a = 1 }", "a table")])
def test_a_toml_array_or_table_for_any_setting_names_the_key_the_value_and_what_is_valid(
    tmp_path, name, toml, kind
):
    path = tmp_path / "run.toml"
    path.write_text(f"{flag(name)[2:]} = {toml}\n")
    with pytest.raises(ConfigError) as info:  # workload = [1, 2] was "unhashable type: 'list'"
        config_from(path, cli_targets=True)
    message = str(info.value)
    assert message.startswith(f"{path}: key {flag(name)[2:]!r}: {name} must be "), message
    assert f"got {read_toml(path)[name]!r}" in message, message
    assert f"({kind}; each setting takes one value, e.g. {flag(name)[2:]} = " in message, message


def test_a_collection_from_python_is_refused_the_same_way():
    with pytest.raises(ConfigError, match=r"--workload: workload must be one of 'cnn', "
                       r"'char-lm', got \['cnn'\] \(an array; .* workload = \"cnn\"\)"):  # fmt: skip
        config_from(None, {"workload": ["cnn"]}, cli_targets=True)


@pytest.mark.parametrize("text", ["loader = 3", 'loader = "fast"', "loader = [4]"])
def test_a_loader_key_that_is_not_a_table_says_what_the_table_is(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text + "\n")
    value = read_toml.__globals__["tomllib"].loads(text)["loader"]
    with pytest.raises(ConfigError) as info:
        config_from(path)
    assert str(info.value).startswith(
        f"{path}: key 'loader' must be a table of the loader's settings, got {value!r}"
    )
    assert "under a [loader] line (e.g. echo-factor = 4)" in str(info.value)


# Settings that had no upper limit: each now has one, with its reason.
CEILINGS = {
    "budget": ("18446744073709551616", r"an integer in 1\.\.9007199254740992", "2\\*\\*53"),
    "max_steps": ("18446744073709551616", r"an integer in 1\.\.9007199254740992", "2\\*\\*53"),
    "train_examples": ("2**60", r"an integer in 1\.\.9007199254740992", "2\\*\\*53"),
    "eval_every": ("2**60", r"an integer in 1\.\.9007199254740992", "2\\*\\*53"),
    "eval_examples": ("2**60", r"an integer in 1\.\.9007199254740992", "2\\*\\*53"),
    "screen_examples": ("2**60", r"an integer in 0\.\.9007199254740992", "2\\*\\*53"),
    "checkpoint_every": ("2**60", r"an integer in 1\.\.9007199254740992", "2\\*\\*53"),
    "retry_seconds": ("1e19", r"a number in \[0, 86400\]", "more than a day"),
    "lr": ("1e19", r"a number in \(0, 10\]", "grids stop at 10"),
    "target_loss": ("1e19", r"a number in \(0, 8\]", "ln 256"),
    "screen_margin": ("1e19", r"a number in \[0, 8\]", "always calls the full evaluation"),
}


@pytest.mark.parametrize("name", CEILINGS)
def test_counts_and_rates_without_a_limit_before_are_refused_past_theirs(name):
    text, valid, why = CEILINGS[name]
    text = str(eval(text)) if "**" in text else text  # noqa: S307 (a literal of this file)
    workload = "char-lm" if name == "target_loss" else "cnn"
    with pytest.raises(ConfigError, match=rf"--{name.replace('_', '-')}: {name} must be {valid}"
                       rf"( or '\w+')?, got .*\(.*{why}"):  # fmt: skip
        config_from(None, {"workload": workload, name: text})


def test_the_new_ceilings_themselves_are_accepted():
    cfg = TrainConfig(budget=2**53, max_steps=2**53, eval_every=2**53, retry_seconds=86_400,
                      lr=10, screen_margin=8, checkpoint_every=2**53)  # fmt: skip
    assert (cfg.budget, cfg.lr, cfg.retry_seconds) == (2**53, 10.0, 86_400.0)
    assert TrainConfig(workload="char-lm", target_loss=8).target_loss == 8.0
