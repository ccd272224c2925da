"""The wheel: `kvscope` and nothing else at the top of site-packages, the app's assets inside
`kvscope/app/assets`, and a package list in pyproject.toml that matches the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_package_list_matches_the_source_tree():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {
        f"kvscope.{name}"
        for name in find_packages(str(ROOT), include=["app*", "engine*", "kernels*"])
    }
    # kvscope.app.assets is the top-level assets/ folder, mapped in [tool.setuptools.package-dir].
    assert listed == found | {"kvscope.app.assets"}, (
        f"add {sorted(found - listed)} / drop {sorted(listed - found - {'kvscope.app.assets'})} "
        "in pyproject.toml [tool.setuptools] packages"
    )


def test_listed_assets_exist():
    for name in PYPROJECT["tool"]["setuptools"]["package-data"]["kvscope.app.assets"]:
        assert (ROOT / "assets" / name).is_file(), f"pyproject lists assets/{name}, not there"


def test_wheel_top_level_and_assets(tmp_path):
    # Build from a copy so that no build/ or egg-info appears in the checkout.
    src = tmp_path / "src"
    for name in ("app", "engine", "kernels", "assets"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"kvscope", "kvscope-0.1.0.dist-info"}
    assert {n.split("/")[1] for n in names if n.startswith("kvscope/")} == {
        "app",
        "engine",
        "kernels",
    }
    assert "kvscope/__init__.py" not in names  # a namespace package: nothing of its own
    for asset in ("style.qss", "style_light.qss", "kvscope.png", "chat_mixed.json"):
        assert f"kvscope/app/assets/{asset}" in names
    assert "kvscope/app/assets/screenshot.png" not in names
