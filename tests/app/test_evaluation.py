"""Background evaluation: weight copies, order, errors, no thread left; and in the real training loop."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from torch import nn

from dataecho.app.evaluation import BackgroundEvaluator
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, write_subset
from dataecho.app.train import TrainConfig, train

pytestmark = pytest.mark.timeout(120)


def eval_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dataecho-eval")]


def weight_sum(model: nn.Module) -> float:
    return float(sum(p.detach().sum() for p in model.parameters()))


def test_each_result_is_of_the_weights_at_submit_in_order_and_the_thread_ends():
    model = nn.Linear(3, 1)
    release = threading.Event()

    def slow_sum(weights: nn.Module) -> float:
        release.wait(10)  # the training side changes the weights meanwhile
        return weight_sum(weights)

    with BackgroundEvaluator(model, slow_sum) as ev:
        before = weight_sum(model)
        assert ev.submit(model, tag="first") == []
        with torch.no_grad():
            model.weight.add_(1.0)  # a step after the snapshot
        assert ev.poll() == [] and ev.busy  # still running: poll never blocks
        release.set()
        finished = ev.submit(model, tag="second")  # waits for the first
        assert finished == [("first", pytest.approx(before))]
        assert ev.wait() == [("second", pytest.approx(before + 3.0))]
        assert ev.wait() == [] and not ev.busy
        assert len(eval_threads()) == 1
    assert eval_threads() == []


def test_an_evaluation_error_reaches_the_caller_with_its_traceback():
    def broken(snapshot: nn.Module) -> float:
        raise RuntimeError("evaluation set unreadable")

    with BackgroundEvaluator(nn.Linear(2, 2), broken) as ev:
        ev.submit(nn.Linear(2, 2), tag=0)
        with pytest.raises(RuntimeError, match="unreadable") as info:
            ev.wait()
    assert any(entry.name == "broken" for entry in info.traceback)
    assert eval_threads() == []


@pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_training_with_background_evaluation_matches_the_inline_run(tmp_path):
    """Same snapshots, same accuracies: evaluation in the background changes when a result is
    known, never what it is or what training does."""
    data_dir = write_subset(tmp_path, train=2048, test=400)
    base = TrainConfig(data_dir=data_dir, train_examples=1024, budget=1024, batch_size=64,
                       eval_every=256, eval_examples=200, num_workers=0,
                       target_accuracy=None)  # fmt: skip
    inline = train(base, log=lambda line: None)
    background = train(dataclasses.replace(base, eval_in_background=True), log=lambda line: None)
    key = lambda rows: [(r["fresh"], r["steps"], r["accuracy"]) for r in rows]  # noqa: E731
    assert key(background.history) == key(inline.history)
    assert len(inline.history) == 4
    assert background.losses == inline.losses
    assert eval_threads() == []
    # With a target: the run stops once a finished evaluation reached it, at or after the
    # snapshot that did, and never before that snapshot's fresh examples.
    # Its final figures are those of the weights that reached the target, as in line.
    low = dataclasses.replace(base, target_accuracy=0.2)
    hit = train(dataclasses.replace(low, eval_in_background=True), log=lambda line: None)
    hit_inline = train(low, log=lambda line: None)
    assert hit.fresh_to_target == hit_inline.fresh_to_target == hit.history[0]["fresh"] == 256
    assert hit.steps >= hit.history[0]["steps"] == hit_inline.steps
    assert hit.seconds_to_target >= hit.history[0]["seconds"]
    assert (hit.test_accuracy, hit.test_loss) == (hit_inline.test_accuracy, hit_inline.test_loss)


def test_background_evaluation_is_refused_for_data_parallel_runs():
    with pytest.raises(ValueError, match="eval_in_background=True with nproc=2"):
        TrainConfig(eval_in_background=True, nproc=2)
