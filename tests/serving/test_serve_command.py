"""`xirang serve`: one replica as a plain process (a Deployment's container), stopped by SIGTERM."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.serving.serving_helpers import body, digits_model
from tests.waiting import wait_for
from xirang_platform.serving import registry

XIRANG = Path(sys.executable).with_name("xirang")


def test_a_served_process_registers_answers_and_drains_on_sigterm(tmp_path: Path) -> None:
    model = tmp_path / "model-v5.pkl"
    model.write_bytes(pickle.dumps(digits_model()))
    directory = tmp_path / "registry"
    process = subprocess.Popen(
        [
            str(XIRANG),
            "serve",
            "--model",
            str(model),
            "--service",
            "digits",
            "--version",
            "5",
            "--port",
            "0",
            "--run-id",
            "pod-1",
        ],  # fmt: skip
        env={**os.environ, registry.REGISTRY_ENV: str(directory)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        (endpoint,) = wait_for("the replica registered", lambda: registry.endpoints(directory, "digits"))
        answers = [httpx.post(f"{endpoint.url}/predict", json=body(offset=i), timeout=10) for i in range(2)]
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert (endpoint.run_id, endpoint.model_version) == ("pod-1", "5")
    assert [a.status_code for a in answers] == [200, 200]
    assert process.returncode == 0, err
    assert "drained: answered 2 prediction requests" in err
    assert registry.endpoints(directory, "digits") == []


def test_serving_a_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(XIRANG), "serve", "--model", str(tmp_path / "nope.pkl"), "--service", "digits"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "no such file; give a pickled model" in done.stderr
