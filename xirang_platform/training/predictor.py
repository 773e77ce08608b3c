"""A trained MLP as a numpy classifier: what the evaluation scores and the serving replicas load.

Rank 0 writes the trained weights with `save` when training is done (`checkpoint.classifier_of` takes
them from the torch model); the forward pass here is the model's own (linear layers with ReLU between
them, the class with the largest logit). So neither the Dagster step that launched the workers nor a
serving replica imports torch: a replica's start, which the serving benchmark times, stays what it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class MlpClassifier:
    """Linear layers (`weights[i]` is `(out, in)` as torch keeps it) with ReLU between them."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    @property
    def n_features_in_(self) -> int:
        """The width of an input row (scikit-learn's name, which the serving replica reads)."""
        return int(self.weights[0].shape[1])

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The last layer's outputs for rows `x`."""
        h = np.asarray(x, dtype=np.float32)
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w.T + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return h

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The predicted class of each row of `x`."""
        return np.argmax(self.logits(x), axis=1)

    def save(self, path: Path) -> None:
        """Write the weights to `path` (.npz: the weights, then the biases) atomically (temporary file, then rename)."""
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, *self.weights, *self.biases)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> MlpClassifier:
        """The classifier `save` wrote to `path`."""
        with np.load(path) as doc:
            arrays = [doc[f"arr_{i}"] for i in range(len(doc.files))]
        layers = len(arrays) // 2
        return cls(tuple(arrays[:layers]), tuple(arrays[layers:]))
