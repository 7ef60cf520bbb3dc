"""The small CNN and evaluate(): shapes, that it learns, and that the figures are right."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dataecho.app.config import TrainConfig
from dataecho.app.workloads.cnn import CNN, SmallCNN, evaluate
from dataecho.app.workloads.image_augment import Augment, normalize


def test_shapes_and_size():
    model = SmallCNN()
    assert model(torch.zeros(5, 1, 28, 28)).shape == (5, 10)
    assert 150_000 < sum(p.numel() for p in model.parameters()) < 300_000
    assert SmallCNN(in_channels=3, num_classes=4, width=8)(torch.zeros(2, 3, 28, 28)).shape == (
        2,
        4,
    )


class Fixed(nn.Module):
    """Predicts class = first pixel value (as logits), so accuracy and loss are known."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(x[:, 0, 0, 0].long(), 3).float() * 5


def test_evaluate_counts_right_and_wrong_and_averages_the_loss():
    x = torch.tensor([0, 1, 2, 2.0]).view(4, 1, 1, 1)
    y = torch.tensor([0, 1, 2, 0])
    result = evaluate(Fixed(), (x, y), batch_size=3)  # 2 chunks: 3 + 1
    assert result.accuracy == 0.75 and result.examples == 4
    expected = F.cross_entropy(Fixed()(x), y).item()
    assert result.loss == pytest.approx(expected, rel=1e-6)


def test_evaluate_takes_tensors_or_a_loader_alike_and_normalises_uint8():
    torch.manual_seed(0)
    model = SmallCNN()
    images = torch.randint(0, 256, (50, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (50,))
    a = evaluate(model, (images, labels), batch_size=16)
    b = evaluate(model, [(images[:20], labels[:20]), (images[20:], labels[20:])])
    c = evaluate(model, (normalize(images), labels))
    assert a.accuracy == b.accuracy == c.accuracy
    assert a.loss == pytest.approx(b.loss) and a.loss == pytest.approx(c.loss)


def test_evaluate_restores_the_mode_and_rejects_bad_input():
    model = SmallCNN().train()
    evaluate(model, (torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)))
    assert model.training
    model.eval()
    evaluate(model, (torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)))
    assert not model.training
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        evaluate(model, (torch.zeros(3, 1, 28, 28), torch.zeros(2, dtype=torch.long)))
    with pytest.raises(ValueError, match="no examples"):
        evaluate(model, [])


@pytest.mark.timeout(60)
def test_it_learns_a_small_set():
    """Real training signal: 200 noisy class templates become separable within 40 steps."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    templates = torch.rand(10, 1, 28, 28)
    labels = torch.arange(200) % 10
    images = (templates[labels] + 0.3 * torch.randn(200, 1, 28, 28)).clamp(0, 1)
    model = SmallCNN()
    before = evaluate(model, (images, labels)).accuracy
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(40):
        batch = slice(step % 4 * 50, step % 4 * 50 + 50)
        loss = F.cross_entropy(model(normalize(images[batch])), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = evaluate(model, (images, labels))
    assert before < 0.3 and after.accuracy > 0.9


@pytest.mark.parametrize("where", ["before_augment", "batch"])
def test_the_workers_uint8_batches_train_as_the_augmented_float_batches_do(where):
    # The workers shift and flip uint8 batches, the step normalises: the same draws and the
    # same values as augmenting and normalising in the workers.
    cfg = TrainConfig(where=where, augment_pad=2)
    sent = CNN.transforms(cfg, sharded=True).batch_transform
    images = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (64,))
    torch.manual_seed(5)
    batch = sent((images, labels))
    torch.manual_seed(5)
    want, _ = Augment(pad=2)((images, labels))
    assert batch[0].dtype == torch.uint8 and torch.equal(normalize(batch[0]), want)
    model = SmallCNN()
    assert torch.equal(CNN.loss(model, batch), F.cross_entropy(model(want), labels))
