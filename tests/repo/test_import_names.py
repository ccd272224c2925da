"""KVScope installs one top-level name, `kvscope`, and nothing else can shadow it or be shadowed.

The folders app/, engine/ and kernels/ install as kvscope.app, kvscope.engine and kvscope.kernels.
They used to install under their own plain names, and transformers 5.25, which requires Hugging
Face's `kernels` distribution, then died inside its hub integration on
`from kernels import CUDAProperties`, which found our kernels/. These say what collides, and where,
before anything else fails.
"""

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

from kvscope.engine.child_python import SAFE_PATH_FLAGS

OUR_PACKAGES = ("kvscope.app", "kvscope.engine", "kvscope.kernels")


def test_no_other_distribution_ships_our_top_level_name():
    owners = set(importlib.metadata.packages_distributions().get("kvscope", []))
    others = sorted(owners - {"kvscope"})
    assert not others, f"installed distribution(s) {others} also ship a top-level `kvscope`"


def test_we_ship_no_top_level_name_but_kvscope():
    ours = sorted(
        name
        for name, owners in importlib.metadata.packages_distributions().items()
        if "kvscope" in owners and not name.startswith("__editable__")
    )
    assert ours == ["kvscope"], ours


@pytest.mark.parametrize("name", OUR_PACKAGES)
def test_our_name_resolves_to_the_repository(name):
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    folder = name.split(".")[1]
    assert Path(spec.origin).resolve().is_relative_to(REPO / folder), spec.origin


def test_hugging_faces_kernels_is_not_ours():
    spec = importlib.util.find_spec("kernels")
    if spec is not None:
        assert not Path(spec.origin).resolve().is_relative_to(REPO / "kernels"), spec.origin


def test_transformers_imports_past_its_hub_kernels_check():
    # The module whose import failed when Hugging Face's `kernels` was installed beside ours.
    from transformers.integrations import hub_kernels  # noqa: F401


def test_a_child_python_run_from_the_checkout_sees_no_top_level_folders():
    # `python -m` in the repository would put app/, engine/ and kernels/ on the path as top-level
    # packages; the children we start are run with -P (engine/child_python.py).
    probe = (
        "import importlib.util as u; "
        "print([n for n in ('app', 'engine') if u.find_spec(n) is not None]); "
        "from transformers.integrations import hub_kernels"
    )
    run = subprocess.run(
        [sys.executable, *SAFE_PATH_FLAGS, "-c", probe],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
