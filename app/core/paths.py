"""Where user data lives: the platform's user data dir, or KVSCOPE_DATA_DIR when set."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs


def _assets_dir() -> Path:
    # A wheel installs assets/ as the package folder app/assets; a source checkout and the
    # PyInstaller bundle keep it beside app/ (this file is app/core/paths.py).
    app_dir = Path(__file__).resolve().parents[1]
    installed = app_dir / "assets"
    return installed if installed.is_dir() else app_dir.parent / "assets"


ASSETS_DIR = _assets_dir()


# Set when the data folder cannot be used and a temporary one stands in; the window says so.
data_dir_problem: str | None = None
_stand_in: Path | None = None


def data_dir() -> Path:
    global data_dir_problem, _stand_in
    override = os.environ.get("KVSCOPE_DATA_DIR")
    path = Path(override) if override else Path(platformdirs.user_data_dir("KVScope", "KVScope"))
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError as e:  # read-only, a file in the way, a full disk: run anyway, say so
        if _stand_in is None:
            _stand_in = Path(tempfile.mkdtemp(prefix="kvscope-session-"))
            data_dir_problem = (
                f"The data folder {path} cannot be used ({e}). This session keeps its chats "
                f"and settings in the temporary folder {_stand_in}; set KVSCOPE_DATA_DIR to a "
                "writable folder to keep them."
            )
        return _stand_in


def cache_dir() -> Path:
    """Rebuildable files (benchmark models): the user cache dir, or KVSCOPE_DATA_DIR/cache."""
    override = os.environ.get("KVSCOPE_DATA_DIR")
    path = Path(override) / "cache" if override else Path(platformdirs.user_cache_dir("KVScope"))
    path.mkdir(parents=True, exist_ok=True)
    return path
