"""docs/add-a-team.md followed to the letter: its snippets merged into copies of the repository's
`xirang.yaml`, `workspace.yaml` and `autoscaling.yaml` give a config `check-config` accepts and a
`dagster dev` that, started on them, loads the new team's code location beside the others, charged
to the new tenant (issue 31: adding a team took four files pieced together from definitions.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from xirang_platform.control.live_config import read_live
from xirang_platform.devtools import devserver
from xirang_platform.operations.config_check import check_config

REPO = Path(__file__).resolve().parents[2]
HOW_TO = REPO / "docs" / "add-a-team.md"
JOBS_QUERY = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { ... on RepositoryLocation { repositories { jobs { name } } } } } } } }"""


def snippets(page: str) -> list[tuple[str, dict[str, Any]]]:
    """(file, parsed YAML) for each YAML block of the how-to, the file named in its section's heading."""
    out = []
    for section in re.split(r"^## ", page, flags=re.MULTILINE)[1:]:
        named = re.match(r"\d+\. `([\w.]+)`", section)
        for block in re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL):
            assert named, f"a YAML block in a section that names no file: {section[:60]}"
            out.append((named.group(1), yaml.safe_load(block)))
    return out


def merge(into: Any, snippet: Any) -> Any:
    """The snippet added where the how-to says: mappings key by key, lists appended."""
    if isinstance(into, dict) and isinstance(snippet, dict):
        return {**into, **{k: merge(into[k], v) if k in into else v for k, v in snippet.items()}}
    if isinstance(into, list) and isinstance(snippet, list):
        return into + snippet
    return snippet


def follow_the_how_to(folder: Path) -> list[str]:
    """Copy the three files into `folder` and apply the how-to's snippets; the files it touched."""
    touched = []
    for name, snippet in snippets(HOW_TO.read_text(encoding="utf-8")):
        if not (folder / name).exists():
            shutil.copy(REPO / name, folder / name)
        doc = merge(yaml.safe_load((folder / name).read_text(encoding="utf-8")), snippet)
        (folder / name).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        touched.append(name)
    return touched


def test_the_add_a_team_how_to_gives_a_new_tenant_its_code_location(tmp_path: Path) -> None:
    touched = follow_the_how_to(tmp_path)
    assert sorted(set(touched)) == ["autoscaling.yaml", "workspace.yaml", "xirang.yaml"]  # at most three files

    found = check_config(tmp_path / "xirang.yaml", tmp_path / "workspace.yaml")
    assert [(f.severity, f.check) for f in found] == [("warning", "quota-past-pool")]  # 64 + 64 + 16 of 128 GPUs
    assert read_live(tmp_path / "xirang.yaml").config.tenant_for("speech") == "speech"

    home = devserver.prepare_home(tmp_path / "dagster")
    env = {"XIRANG_CONFIG": str(tmp_path / "xirang.yaml"), "XIRANG_LEDGER_URL": f"sqlite:///{tmp_path / 'l.sqlite'}"}
    with devserver.running(home, locations=3, env=env, cwd=tmp_path) as server:  # as `make run` restarted
        entries = server.graphql(JOBS_QUERY)["workspaceOrError"]["locationEntries"]
    loaded = {e["name"]: e["loadStatus"] for e in entries}
    assert loaded == {"research": "LOADED", "product": "LOADED", "speech": "LOADED"}
    [speech] = [e for e in entries if e["name"] == "speech"]
    jobs = {j["name"] for r in speech["locationOrLoadError"]["repositories"] for j in r["jobs"]}
    assert {"lifecycle", "inference_replica", "gpu_probe"} <= jobs
