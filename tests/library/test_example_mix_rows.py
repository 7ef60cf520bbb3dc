"""A batch's rows as wide words (dataecho.stages.example_mix): exact round trips, clear errors."""

from __future__ import annotations

import pytest
import torch

from dataecho.stages.example_mix import RowLayout, tensor_leaves


def test_rows_round_trip_exactly_through_the_widest_word_that_fits():
    batch = {
        "image": torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8),  # 784 bytes: int64
        "rgb": torch.randint(0, 256, (5, 3), dtype=torch.uint8),  # 3 bytes: uint8
        "half": torch.randn(5, 3).half(),  # 6 bytes: int16
        "label": torch.arange(5),
        "mask": torch.arange(5) % 2 == 0,
    }
    layout = RowLayout(batch)
    assert layout.words == [torch.int64, torch.uint8, torch.int16, torch.int64, torch.uint8]
    words = layout.to_words(batch)
    assert all(w.dim() == 2 and len(w) == 5 for w in tensor_leaves(words))
    back = layout.from_words(words)
    assert set(back) == set(batch)
    for key, value in batch.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key


def test_views_that_are_strided_or_misaligned_come_through():
    base = torch.zeros(11, dtype=torch.uint8)
    misaligned = base[1:].view(5, 2)  # 2-byte rows at an odd address: no int16 view of them
    misaligned[:, 0] = torch.arange(5, dtype=torch.uint8)
    expanded = torch.arange(5.0).view(5, 1).expand(5, 4)  # stride 0 along a row
    layout = RowLayout((misaligned, expanded))
    back = layout.from_words(layout.to_words((misaligned, expanded)))
    assert torch.equal(back[0], misaligned) and torch.equal(back[1], expanded)


def test_a_batch_unlike_the_first_is_refused_naming_both():
    layout = RowLayout((torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)))
    assert layout.size((torch.ones(2, 3), torch.ones(2, dtype=torch.long))) == 2
    with pytest.raises(ValueError, match=r"got \[\('torch.float32', \(5,\)\).* after"):
        layout.size((torch.zeros(4, 5), torch.zeros(4, dtype=torch.long)))
    with pytest.raises(ValueError, match="one row per example; got shapes"):
        layout.size((torch.zeros(4, 3), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(TypeError, match="got a str leaf"):
        tensor_leaves((torch.zeros(2), "caption"))
    with pytest.raises(TypeError, match="at least one tensor"):
        tensor_leaves(())
