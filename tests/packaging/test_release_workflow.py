"""The release workflow is a valid GitHub Actions workflow and builds what packaging/ describes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def test_workflow_validates_against_the_github_schema():
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is in the dev extra")
    # The schema ships inside check-jsonschema: no network.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(WORKFLOW),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_workflow_builds_both_platforms_and_publishes_on_tags():
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert on["push"]["tags"] == ["v*"]
    choice = on["workflow_dispatch"]["inputs"]["windows_torch"]
    assert choice["default"] == "cpu" and "cpu" in choice["options"] and len(choice["options"]) > 1
    jobs = wf["jobs"]
    assert jobs["linux"]["runs-on"].startswith("ubuntu")
    assert jobs["windows"]["runs-on"].startswith("windows")
    assert set(jobs["publish"]["needs"]) == {"linux", "windows"}
    assert "refs/tags/v" in jobs["publish"]["if"]
    text = WORKFLOW.read_text(encoding="utf-8")
    for path in (
        "packaging/kvscope.spec",
        "packaging/windows/kvscope.nsi",
        "packaging/project_version.py",
        "packaging/glibc_floor.py",
    ):
        assert path.replace("/", "\\") in text or path in text, path
        assert (ROOT / path).is_file(), path
    assert "make package" in text and "make package-test" in text
