"""Our three top-level packages are ours alone in this environment.

`app`, `engine` and `kernels` are plain names. When another installed distribution ships a
top-level package of the same name, one of the two is shadowed, and whichever is shadowed fails
far from the cause: transformers 5.25 requires Hugging Face's `kernels`, and with it installed
`import transformers` died inside its hub integration on `from kernels import CUDAProperties`,
which found our kernels/. This says what collides, and where, before anything else fails.
"""

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("app", "engine", "kernels")


@pytest.mark.parametrize("name", OUR_PACKAGES)
def test_no_other_distribution_ships_our_top_level_name(name):
    owners = set(importlib.metadata.packages_distributions().get(name, []))
    others = sorted(owners - {"kvscope"})
    assert not others, (
        f"installed distribution(s) {others} also ship a top-level `{name}` package, which "
        f"collides with KVScope's {name}/ (pin them out in pyproject.toml)"
    )


@pytest.mark.parametrize("name", OUR_PACKAGES)
def test_our_name_resolves_to_the_repository(name):
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(REPO), spec.origin


def test_transformers_imports_past_its_hub_kernels_check():
    # The module whose import failed when Hugging Face's `kernels` was installed beside ours.
    from transformers.integrations import hub_kernels  # noqa: F401
    from transformers.utils.import_utils import is_kernels_available

    assert not is_kernels_available(), "transformers takes our kernels/ for Hugging Face's"
