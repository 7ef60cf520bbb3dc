"""The control numbers an exchange carries (dataecho.app.distributed.control): packed into
floats for the all-reduce and back, counts summed and votes any rank's, and the tally of one
process's steps between exchanges."""

from __future__ import annotations

import dataclasses
import signal

import pytest
import torch

from dataecho.app.distributed.control import ANY, SUM, Control, Tally
from dataecho.app.distributed.signals import StopSignals


def test_pack_unpack_round_trip():
    every = Control(fresh=1_000_000, steps=7, target=True, sigterm=False, sigint=True, void=True)
    for control in (Control(), every):
        payload = control.pack()
        assert payload.dtype == torch.float32 and payload.shape == (Control.width(),)
        assert Control.unpack(payload) == control


def test_each_field_declares_its_reduction():
    reduce = {f.name: f.metadata["reduce"] for f in dataclasses.fields(Control)}
    assert reduce == {"fresh": SUM, "steps": SUM, "target": ANY, "sigterm": ANY, "sigint": ANY,
                      "void": ANY}  # fmt: skip


def test_a_summed_payload_unpacks_to_counts_summed_and_votes_of_any_rank():
    ranks = [Control(fresh=32, steps=1), Control(fresh=64, steps=2, sigterm=True),
             Control(fresh=0, steps=0, sigterm=True, void=True)]  # fmt: skip
    summed = Control.unpack(sum(c.pack() for c in ranks))  # what all_reduce(SUM) gives
    assert summed == Control(fresh=96, steps=3, sigterm=True, void=True)
    assert summed.stopping and not summed.target and not summed.sigint
    assert not Control.unpack(sum(Control(fresh=1).pack() for _ in range(3))).stopping


def test_unpack_refuses_a_payload_of_another_width():
    with pytest.raises(ValueError, match="a Control packs 6"):
        Control.unpack(torch.zeros(Control.width() - 1))


def test_tally_counts_since_the_last_exchange_and_adds_the_votes():
    signals = StopSignals(enabled=False)
    tally = Tally(signals, fresh_examples=100)  # a resumed loader had read 100 already
    tally.step(132)
    tally.step(132)  # an echoed step: no fresh examples
    assert tally.control(target=False) == Control(fresh=32, steps=2)
    signals.signum = signal.SIGTERM  # as the handler sets it
    assert tally.control(target=True) == Control(fresh=32, steps=2, target=True, sigterm=True)
    assert tally.void() == Control(sigterm=True, void=True)  # a void exchange counts nothing
    tally.exchanged()
    tally.step(164)
    assert tally.control(target=False) == Control(fresh=32, steps=1, sigterm=True)
