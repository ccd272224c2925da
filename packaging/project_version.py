"""Print KVScope's version from pyproject.toml (the single source of the installers' version).

python packaging/project_version.py             # 0.1.0
python packaging/project_version.py --numeric   # 0.1.0.0  (Windows' four-number form)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def project_version(pyproject: Path = PYPROJECT) -> str:
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # 3.10: the one key we need, from the [project] table
        section = text.split("[project]", 1)[1].split("\n[", 1)[0]
        m = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M)
        if not m:
            raise ValueError(f"no version in the [project] table of {pyproject}") from None
        return m.group(1)
    return tomllib.loads(text)["project"]["version"]


def numeric_version(version: str) -> str:
    """The leading release numbers padded to four: 0.1.0rc1 -> 0.1.0.0, 1.2 -> 1.2.0.0."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    if not m:
        raise ValueError(f"version {version!r} does not start with a number")
    parts = m.group(0).split(".")[:4]
    return ".".join(parts + ["0"] * (4 - len(parts)))


if __name__ == "__main__":
    v = project_version()
    print(numeric_version(v) if "--numeric" in sys.argv[1:] else v)
