"""The models the demos train, with their augmentation and evaluation."""

from dataecho.workloads.augment import Augment, normalize
from dataecho.workloads.cnn import EvalResult, SmallCNN, evaluate

__all__ = ["Augment", "EvalResult", "SmallCNN", "evaluate", "normalize"]
