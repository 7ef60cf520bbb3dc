"""Echoed optimizers (Agarwal et al. 2020) and the convex problems used to test them.

``EchoedGD`` / ``EchoedProxGD`` / ``EchoedNesterov``: Echo(A, K), K steps of base method A on
each fresh batch. ``logistic``: logistic-regression problems; ``optimum``: their L-BFGS optimum;
``convergence``: fresh batches to reach 1% of the optimum over a learning-rate grid.
"""

from dataecho.algorithms.convergence import METHODS, Trial, fresh_batches_to_converge
from dataecho.algorithms.echo import Echo, EchoedGD, EchoedNesterov, EchoedProxGD
from dataecho.algorithms.logistic import (
    LogisticProblem,
    covertype_like,
    fashion_mnist,
    logistic_loss,
)
from dataecho.algorithms.optimum import Optimum, lbfgs_optimum

__all__ = [
    "METHODS",
    "Echo",
    "EchoedGD",
    "EchoedNesterov",
    "EchoedProxGD",
    "LogisticProblem",
    "Optimum",
    "Trial",
    "covertype_like",
    "fashion_mnist",
    "fresh_batches_to_converge",
    "lbfgs_optimum",
    "logistic_loss",
]
