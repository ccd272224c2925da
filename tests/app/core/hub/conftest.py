"""Fixtures for hub tests: a started FakeHub, and this process's huggingface_hub pointed at it."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub, point_huggingface_hub_at


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A FakeHub that huggingface_hub (and our hub code) uses, with a cache in `tmp_path/hf`."""
    with FakeHub() as hub:
        point_huggingface_hub_at(hub, tmp_path / "hf", monkeypatch)
        yield hub


@pytest.fixture
def hf_cache(tmp_path: Path, fake_hub: FakeHub) -> Path:
    """The HF_HUB_CACHE the fake_hub fixture set up."""
    return tmp_path / "hf" / "hub"
