"""The training data: scikit-learn's bundled handwritten digits, and the file that hands them to the workers.

The `trained_model` asset receives its rows from the `training_dataset` asset and writes them to one
`.npz` file that every `torchrun` worker reads, so the workers train on exactly the asset's data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def digits_split(seed: int = 0) -> dict[str, np.ndarray]:
    """The handwritten digits (1,797 8x8 images shipped with scikit-learn), scaled to 0..1, split 80/20."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def write_rows(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """Write training rows `x` (float32 features) and labels `y` for the workers; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=np.asarray(x, dtype=np.float32), y=np.asarray(y, dtype=np.int64))
    return path


def read_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The rows and labels `write_rows` wrote."""
    with np.load(path) as doc:
        return doc["x"], doc["y"]
