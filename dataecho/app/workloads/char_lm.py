"""The char-lm workload: a small character-level Transformer language model trained on Jane
Austen's novels (:data:`CHAR_LM`).

Sized for a CPU demo. The default :class:`CharLMConfig` (context 64, d_model 64, 2 layers,
4 heads, feed-forward 2x) has 76 k parameters; :func:`measure_step_seconds` times one training
step (forward, backward, AdamW) on the machine at hand. A step costs about 6 x parameters x
characters flops, so d_model 128 with a 128-character context (0.3 M parameters, twice the
characters a batch) costs several times as much a step: available through the config, too slow
as a default on a CPU.

The block is the usual pre-LayerNorm decoder block written out with
``F.scaled_dot_product_attention(is_causal=True)`` rather than ``nn.TransformerEncoderLayer``:
no mask tensor to build, and every weight is in view for the init below.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Subset

from dataecho import _validate
from dataecho.app.workloads.base import (
    EvalSplits,
    RunSettings,
    Split,
    Transforms,
    Workload,
    digest,
)
from dataecho.errors import DataechoValueError

if TYPE_CHECKING:
    from torch.utils.data import Dataset


# The Austen vocabulary's size, <unk> included: what a synthetic step's model is built for.
AUSTEN_VOCAB = 82


@dataclass(frozen=True)
class CharLMConfig:
    """Sizes of :class:`CharTransformer`; ``vocab_size`` includes the ``<unk>`` id."""

    vocab_size: int
    context: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    ff_mult: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "d_model", "n_layers", "n_heads", "ff_mult"):
            _validate.positive_int(getattr(self, name), name=name)
        if self.d_model % self.n_heads:
            raise DataechoValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}); "
                f"pick n_heads among {[h for h in range(1, 17) if self.d_model % h == 0]}"
            )


class Block(nn.Module):
    """x + attn(LN(x)), then x + mlp(LN(x)); causal self-attention, no dropout."""

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff_in = nn.Linear(cfg.d_model, cfg.ff_mult * cfg.d_model)
        self.ff_out = nn.Linear(cfg.ff_mult * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        # (B, T, D) -> (B, heads, T, D/heads) for the attention kernel.
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff_out(F.gelu(self.ff_in(self.ln2(x))))


class CharTransformer(nn.Module):
    """Token + learned position embeddings, ``n_layers`` blocks, LayerNorm, tied output layer.

    Input: int64 ids (B, T) with T <= ``context``. Output: logits (B, T, vocab_size), position
    t predicting character t + 1.
    """

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tying: fewer parameters, faster early learning
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2-style init: N(0, 0.02) weights, zero biases, LayerNorm at identity.

        The projections that write into the residual stream are scaled by 1/sqrt(2 n_layers)
        so the stream's variance at the output does not grow with depth.
        """
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for layer in (block.proj, block.ff_out):
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * self.cfg.n_layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.cfg.context:
            raise DataechoValueError(
                f"input has {t} positions but the model's context is {self.cfg.context}; "
                f"cut sequences to seq_len <= {self.cfg.context} or build a larger model"
            )
        x = self.tok(ids) + self.pos.weight[:t]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-character cross-entropy in nats over every position of the batch."""
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy (nats per character) over all target characters of ``batches``.

    Runs in eval mode (the mode is restored after). Every character counts once, so batches
    of different sizes are weighted correctly. Divide by ln 2 for bits per character.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for inputs, targets in batches:
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
            total += loss.item()  # a Python float (double): no float32 drift over many batches
            count += targets.numel()
    finally:
        model.train(was_training)
    if count == 0:
        raise DataechoValueError("evaluate() got no characters; pass a non-empty validation set")
    return total / count


def unigram_entropy(ids: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats) of the ids' empirical distribution: the cross-entropy of the best model
    that ignores context, on those very ids; a language model must get below it."""
    p = torch.bincount(ids.flatten(), minlength=vocab_size).double() / ids.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def make_optimizer(model: nn.Module, lr: float = 3e-3, weight_decay: float = 0.01):
    """AdamW with weight decay on matrices only (not on biases, LayerNorms or positions)."""
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith("pos")]
    rest = [p for n, p in model.named_parameters() if p.ndim != 2 or n.startswith("pos")]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))


def measure_step_seconds(cfg: CharLMConfig, batch_size: int = 32, *, steps: int = 10) -> float:
    """Median seconds of one training step (forward, backward, AdamW) on random ids.

    Uses the current ``torch.get_num_threads()``; set it first (e.g. 1) to measure t_down.
    """
    steps = _validate.positive_int(steps, name="steps")
    gen = torch.Generator().manual_seed(0)
    model = CharTransformer(cfg)
    opt = make_optimizer(model)
    ids = torch.randint(cfg.vocab_size, (batch_size, cfg.context + 1), generator=gen)
    times = []
    for i in range(steps + 2):  # two warm-up steps: allocator and kernel selection
        start = time.perf_counter()
        loss = lm_loss(model, ids[:, :-1], ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@functools.lru_cache(maxsize=2)
def novels(package_dir: Path) -> dict[str, list[str]]:
    """The six novels, read once per process (parsing the R database is slow)."""
    from dataecho.app.sources.austen import load_novels  # imports rdata: only for char-lm

    return load_novels(package_dir)


class SplitChunk:
    """A token chunk of ``seq_len + 1`` ids -> ``(input, target)``, the target shifted by one."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def __call__(self, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if chunk.shape != (self.seq_len + 1,):
            raise DataechoValueError(
                f"a shard holds a chunk of shape {tuple(chunk.shape)}, but seq_len={self.seq_len} "
                f"needs {self.seq_len + 1} ids; prepare with --seq-len {len(chunk) - 1} or train "
                f"with seq_len={len(chunk) - 1}"
            )
        return chunk[:-1].clone(), chunk[1:].clone()


class AustenCharLM(Workload):
    """CharTransformer with AdamW on Jane Austen's novels, an example one chunk of ``seq_len``
    characters; its metric: the validation cross-entropy in nats per character."""

    name = "char-lm"
    dataset = "austen"
    shard_kind = "tokens"
    # Evaluations are sized to decide a target while costing a small share of a run's time.
    defaults = MappingProxyType(
        {"batch_size": 32, "lr": 3e-3, "budget": 64_000, "eval_every": 3_200,
         "eval_examples": 512}
    )  # fmt: skip
    target_key = "target_loss"
    cli_target = 1.8  # reached well within the default budget
    metric = "val_loss"
    summary = "a character-level Transformer on Jane Austen's novels"
    data_folder = "janeaustenr package folder"
    eval_split = "validation"
    optimizer = "AdamW"
    higher_is_better = False

    def default_data_dir(self) -> Path:
        from dataecho.app.sources.austen import DEFAULT_PACKAGE_DIR  # imports rdata

        return DEFAULT_PACKAGE_DIR

    def eval_splits(self, cfg: RunSettings) -> EvalSplits:
        from dataecho.app.sources.austen import AustenChars

        val = AustenChars("val", cfg.seq_len, package_dir=cfg.data_dir, novels=novels(cfg.data_dir))
        # Evenly spaced chunks: the split is the end of each novel in turn, so the first N
        # would all come from the first novel.
        pick = torch.linspace(0, len(val) - 1, min(cfg.eval_examples, len(val))).long()
        return EvalSplits(
            (val.chunks[pick, :-1], val.chunks[pick, 1:]),
            (val.chunks[:, :-1], val.chunks[:, 1:]),
            len(val.vocab),
        )

    def in_memory(self, cfg: RunSettings) -> tuple[Dataset, str, str]:
        from dataecho.app.sources.austen import AustenChars

        train = AustenChars(
            "train", cfg.seq_len, package_dir=cfg.data_dir, novels=novels(cfg.data_dir)
        )
        n = min(cfg.train_examples or len(train), len(train))
        content = digest(train.chunks[:n])
        name = f"Austen train chunks of {cfg.seq_len} characters"
        return (Subset(train, range(n)) if n < len(train) else train), name, content

    def transforms(self, cfg: RunSettings, *, sharded: bool) -> Transforms:
        # No augmentation: a shard's chunk only splits into input and target.
        return Transforms(transform=SplitChunk(cfg.seq_len) if sharded else None)

    def write_shards(
        self, out: Path, data_dir: str | Path, *, examples: int | None, examples_per_shard: int,
        seq_len: int,
    ) -> dict[str, Any]:  # fmt: skip
        """Chunks of ``seq_len + 1`` character ids (uint8) of :class:`AustenChars`' training
        split."""
        from dataecho.app.sources.austen import AustenChars
        from dataecho.app.sources.shard_writer import write_text_shards

        train = AustenChars("train", seq_len, package_dir=data_dir, novels=novels(data_dir))
        if len(train.vocab) > 256:
            raise DataechoValueError(f"{len(train.vocab)} character ids do not fit in uint8")
        chunks = train.chunks[:examples].numpy().astype(np.uint8)
        return write_text_shards(
            list(chunks), out, examples_per_shard=examples_per_shard, prefix=self.dataset
        )

    def build_model(
        self, cfg: RunSettings, vocab_size: int | None
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = CharTransformer(CharLMConfig(vocab_size, context=cfg.seq_len))
        return model, make_optimizer(model, lr=cfg.lr)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return lm_loss(model, inputs, targets)

    def evaluate(self, model: torch.nn.Module, split: Split) -> tuple[float, float | None, float]:
        inputs, targets = split
        batches = ((inputs[i : i + 256], targets[i : i + 256]) for i in range(0, len(inputs), 256))
        loss = evaluate(model, batches)
        return loss, None, loss

    def example_bytes(self, cfg: RunSettings) -> int:
        return 2 * 8 * cfg.seq_len  # input and target, int64 each

    def measure_step_seconds(self, batch_size: int, steps: int, *, seq_len: int) -> float:
        lm = CharLMConfig(AUSTEN_VOCAB, context=seq_len)
        return measure_step_seconds(lm, batch_size, steps=steps)

    def describe_metric(self, value: float) -> str:
        return f"val loss {value:.3f}"


CHAR_LM = AustenCharLM()
