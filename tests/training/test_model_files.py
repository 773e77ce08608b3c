"""What a checkpoint holds and when it may be resumed, and the trained weights as the numpy classifier
the evaluation and the serving replicas use (`training/checkpoint.py`, `training/predictor.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from xirang_platform.training.checkpoint import (
    classifier_of,
    load_checkpoint,
    resumption_problem,
    save_checkpoint,
)
from xirang_platform.training.predictor import MlpClassifier
from xirang_platform.training.worker import build_model

SETTINGS = {"global_batch": 64, "seed": 7, "hidden_units": 32}


def model(seed: int = 3) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return build_model(64, 32)


def saved_state() -> dict[str, Any]:
    """What rank 0 saves after step 23 at world size 2."""
    net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    return {
        **SETTINGS,
        "step": 23,
        "world_size": 2,
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
    }


def test_a_checkpoint_round_trips_and_a_missing_one_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "lineage" / "model.pt"
    assert load_checkpoint(path) is None
    state = saved_state()
    save_checkpoint(path, state)
    back = load_checkpoint(path)
    assert back is not None
    assert {k: back[k] for k in ("step", "world_size", *SETTINGS)} == {"step": 23, "world_size": 2, **SETTINGS}
    for name, tensor in state["model"].items():
        assert torch.equal(back["model"][name], tensor)
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]  # the temporary file was renamed away


@pytest.mark.parametrize(
    ("changed", "problem"),
    [
        pytest.param({}, None, id="the same settings resume at any world size"),
        pytest.param(
            {"global_batch": 32},
            "cannot resume the checkpoint of step 23 with global_batch 32 (the checkpoint's is 64): a resumption "
            "keeps the run config it was trained with; set the checkpoint's values, or materialize as a new run",
            id="another global batch would change every step",
        ),
        pytest.param(
            {"seed": 8, "hidden_units": 16},
            "with seed 8 (the checkpoint's is 7), hidden_units 16 (the checkpoint's is 32)",
            id="another seed and width: both named",
        ),
    ],
)
def test_a_checkpoint_is_resumed_only_with_the_settings_that_fix_its_steps(
    changed: dict[str, int], problem: str | None
) -> None:
    got = resumption_problem(saved_state(), {**SETTINGS, **changed})
    if problem is None:
        assert got is None
    else:
        assert got is not None
        assert problem in got


def test_no_checkpoint_means_nothing_to_refuse() -> None:
    assert resumption_problem(None, SETTINGS) is None


def test_the_numpy_classifier_answers_as_the_torch_model(tmp_path: Path) -> None:
    net = model()
    rows = np.random.default_rng(1).random((50, 64), dtype=np.float32)
    classifier = classifier_of(net.state_dict())
    with torch.no_grad():
        want = net(torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(classifier.logits(rows), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(classifier.predict(rows), want.argmax(axis=1))
    assert classifier.n_features_in_ == 64

    classifier.save(tmp_path / "model.npz")
    back = MlpClassifier.load(tmp_path / "model.npz")
    assert [w.shape for w in back.weights] == [(32, 64), (10, 32)]
    np.testing.assert_array_equal(back.predict(rows), classifier.predict(rows))
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]
