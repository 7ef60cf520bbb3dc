"""One pipeline seed, derived per stage, per worker and per epoch (as grain does).

Deriving with ``numpy.random.SeedSequence`` keeps streams independent: two keys never share a
stream, and the same (seed, keys) always gives the same one.
"""

from __future__ import annotations

import secrets

import numpy as np


def resolve_seed(seed: int | None) -> int:
    """A concrete seed: ``seed`` itself, or fresh OS entropy when it is None.

    Drawing the entropy once, up front, keeps an unseeded stage resumable: its state holds the
    seed it drew.
    """
    return secrets.randbits(63) if seed is None else int(seed)


def fit_seed(seed: int) -> int:
    """``seed`` itself where torch's generators take it (below 2**63), else a 63-bit seed
    derived from all of it: a loader hands its seed to torch and to its workers in 64 bits."""
    return seed if seed < 2**63 else derive_seed(seed)


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for the stream named by ``keys`` (stage, worker, epoch, ...)."""
    seq = np.random.SeedSequence(entropy=int(seed), spawn_key=tuple(int(k) for k in keys))
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


# Stable stage ids: the seed of a stage must not change when another stage is added.
STAGE_ECHO = 1
STAGE_SHUFFLE = 2
STAGE_ORDER = 3
STAGE_TRANSFORM = 4
STAGE_ADAPTIVE = 5
STAGE_STOCHASTIC = 6
STAGE_MIX = 7
