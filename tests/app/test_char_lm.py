"""The char-level Transformer: shapes, causality, init, evaluate(), and that it learns Austen."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dataecho.app.sources.austen import (
    DEFAULT_PACKAGE_DIR,
    INSTALL_COMMAND,
    AustenChars,
    load_novels,
)
from dataecho.app.workloads.char_lm import (
    CharLMConfig,
    CharTransformer,
    evaluate,
    lm_loss,
    make_optimizer,
    measure_step_seconds,
    unigram_entropy,
)

HAVE_DATA = (DEFAULT_PACKAGE_DIR / "data" / "Rdata.rdx").is_file()


@pytest.fixture(autouse=True)
def one_thread():
    # Two cores are shared with other test files; one thread also makes runs deterministic.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_model(vocab: int = 20, **kw) -> CharTransformer:
    torch.manual_seed(0)
    return CharTransformer(CharLMConfig(vocab, context=16, d_model=32, **kw))


def test_config_validates_sizes():
    with pytest.raises(ValueError, match=r"d_model \(64\) must be divisible by n_heads \(5\)"):
        CharLMConfig(10, n_heads=5)
    with pytest.raises(ValueError, match="context must be >= 1, got 0"):
        CharLMConfig(10, context=0)
    with pytest.raises(TypeError, match="vocab_size must be an integer"):
        CharLMConfig(10.0)


def test_shapes_tied_head_and_context_limit():
    model = small_model(n_layers=3)
    ids = torch.randint(20, (4, 11))
    assert model(ids).shape == (4, 11, 20)
    assert model.head.weight is model.tok.weight
    with pytest.raises(ValueError, match="input has 17 positions but the model's context is 16"):
        model(torch.zeros(1, 17, dtype=torch.int64))


def test_attention_is_causal():
    model = small_model()
    ids = torch.randint(20, (2, 16))
    changed = ids.clone()
    changed[:, 9] = (ids[:, 9] + 1) % 20
    a, b = model(ids), model(changed)
    # Positions before 9 cannot see the change; position 9 and later must.
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_init_predicts_nearly_uniform_and_scales_residual_layers():
    model = small_model(vocab=80, n_layers=4)
    ids = torch.randint(80, (8, 17))
    loss = lm_loss(model, ids[:, :-1], ids[:, 1:]).item()
    assert abs(loss - math.log(80)) < 0.05  # no class favoured at the start
    std = model.blocks[0].proj.weight.std().item()
    assert 0.02 / math.sqrt(8) * 0.8 < std < 0.02 / math.sqrt(8) * 1.2
    assert model.blocks[0].ln1.weight.eq(1).all() and model.blocks[0].qkv.bias.eq(0).all()


def test_evaluate_weights_every_character_once_and_restores_mode():
    model = small_model()
    gen = torch.Generator().manual_seed(1)
    ids_a, ids_b = (
        torch.randint(20, (5, 9), generator=gen),
        torch.randint(20, (2, 9), generator=gen),
    )
    batches = [(ids[:, :-1], ids[:, 1:]) for ids in (ids_a, ids_b)]
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in batches])
        targets = torch.cat([y for _, y in batches])
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    model.train()
    assert evaluate(model, batches) == pytest.approx(want, rel=1e-6)
    assert model.training
    with pytest.raises(ValueError, match="got no characters"):
        evaluate(model, [])


def test_unigram_entropy():
    assert unigram_entropy(torch.arange(8).repeat(3), 10) == pytest.approx(math.log(8))
    assert unigram_entropy(torch.full((5,), 3), 10) == 0
    assert unigram_entropy(torch.tensor([[0, 0], [0, 1]]), 2) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    )


def test_optimizer_groups_cover_each_parameter_once():
    model = small_model()
    opt = make_optimizer(model)
    grouped = [p for g in opt.param_groups for p in g["params"]]
    assert len(grouped) == len({id(p) for p in grouped}) == len(list(model.parameters()))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert id(model.tok.weight) in decayed and id(model.pos.weight) not in decayed
    assert measure_step_seconds(CharLMConfig(20, context=8, d_model=16), 2, steps=1) > 0


@pytest.mark.skipif(not HAVE_DATA, reason=f"janeaustenr not installed ({INSTALL_COMMAND})")
@pytest.mark.timeout(120)
def test_a_few_hundred_steps_on_austen_beat_the_unigram_entropy():
    novels = load_novels()
    train = AustenChars("train", 64, novels=novels)
    val = AustenChars("val", 64, novels=novels)
    rows = val.chunks[::8]  # ~390 sequences spread over all six novels' validation parts
    batches = [(rows[i : i + 64, :-1], rows[i : i + 64, 1:]) for i in range(0, len(rows), 64)]
    unigram = unigram_entropy(rows[:, 1:], len(val.vocab))
    torch.manual_seed(0)
    model = CharTransformer(CharLMConfig(len(train.vocab)))
    opt = make_optimizer(model, lr=3e-3)
    before = evaluate(model, batches)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        chunk = train.chunks[torch.randint(len(train), (16,), generator=gen)]
        loss = lm_loss(model, chunk[:, :-1], chunk[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    after = evaluate(model, batches)
    # ln(82) = 4.41 at the start; unigram ~3.08 nats/char; measured ~2.5 after 300 steps.
    assert before > unigram + 1
    assert after < unigram - 0.3, f"val {after:.3f} nats/char vs unigram {unigram:.3f}"
