"""Where user data lives: the platform's user data dir, or KVSCOPE_DATA_DIR when set."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


def data_dir() -> Path:
    override = os.environ.get("KVSCOPE_DATA_DIR")
    path = Path(override) if override else Path(platformdirs.user_data_dir("KVScope", "KVScope"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Rebuildable files (benchmark models): the user cache dir, or KVSCOPE_DATA_DIR/cache."""
    override = os.environ.get("KVSCOPE_DATA_DIR")
    path = Path(override) / "cache" if override else Path(platformdirs.user_cache_dir("KVScope"))
    path.mkdir(parents=True, exist_ok=True)
    return path
