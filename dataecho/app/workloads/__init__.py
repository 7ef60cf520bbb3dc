"""The models the demos train, with their augmentation and evaluation."""

from dataecho.app.workloads.image_augment import Augment, normalize
from dataecho.app.workloads.cnn import EvalResult, SmallCNN, evaluate

__all__ = ["Augment", "EvalResult", "SmallCNN", "evaluate", "normalize"]
