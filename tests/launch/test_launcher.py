"""The `Launcher` the tick and the release sensors call, picked from the platform config's name
(`platform_launcher`): the local one creates nothing, tags the environment and kills the process; the
Kubernetes one is the injected cluster; an unknown name is refused; and a platform on the local
launcher never imports the `kubernetes` client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.k8s_builders import alloc, launch_pool
from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.launch.k8s_cluster import K8sCluster
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.launch.launcher import Launcher, platform_launcher, use_cluster
from xirang_platform.launch.local import LocalLauncher, local_environment
from xirang_platform.scheduling.model import Tier

ROOT = Path(__file__).resolve().parents[2]
POOL = launch_pool()
WHOLE = alloc("train-4").tier(Tier.OFFLINE_TRAINING).gpus("h100-1", 0, 1).build()


def test_the_local_launcher_tags_the_environment_and_has_nothing_to_create_delete_or_pin() -> None:
    launcher: Launcher = platform_launcher("local")

    assert launcher.launch_tags(WHOLE, POOL) == {
        rt.ALLOCATION: run_allocation.allocation_tag(WHOLE, WHOLE.borrowed, "local"),
        rt.ENV: json.dumps(local_environment(WHOLE), sort_keys=True),
    }
    assert json.loads(launcher.launch_tags(WHOLE, POOL)[rt.ENV])["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert (launcher.launch(WHOLE, POOL), launcher.stop(WHOLE, POOL), launcher.pin_gated_pods()) == (None, None, {})
    assert launcher.kill("r1", None) is None  # no process here, and no pods anywhere
    assert launcher.with_grace(300.0) is launcher


def test_the_local_launcher_kills_a_live_process_and_says_so() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert LocalLauncher().kill("r1", process.pid) == f"SIGKILL to process {process.pid}"
        assert process.wait(timeout=10) == -9
    finally:
        process.kill()
    assert LocalLauncher().kill("r1", process.pid) is None  # reaped: nothing left to kill


def test_the_kubernetes_launcher_is_the_cluster_the_process_holds() -> None:
    cluster = K8sCluster(submitter=None, settings=K8sSettings())
    with use_cluster(cluster):
        assert platform_launcher("k8s") is cluster
    assert platform_launcher("local").name == "local"


def test_an_unknown_launcher_is_refused_with_the_names_it_may_be() -> None:
    with pytest.raises(ValueError, match="launcher 'slurm' is not known: use one of local, k8s"):
        platform_launcher("slurm")


def test_a_platform_on_the_local_launcher_never_imports_the_kubernetes_client() -> None:
    code = (
        "import sys, sensors.scheduling_tick, sensors.release, sensors.notices, resources.gpu_pool\n"
        "from xirang_platform.launch.launcher import platform_launcher\n"
        "platform_launcher('local').with_grace(30.0)\n"
        "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
