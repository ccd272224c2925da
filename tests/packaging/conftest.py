"""Helpers for the packaging tests: a throwaway dpkg root to install .deb files into."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


class DpkgRoot:
    """`dpkg --root` into a scratch folder: a real install and removal, away from the system.

    The packages have no maintainer scripts, so nothing is run chrooted; --force-depends because
    the scratch root's own database has none of the system libraries installed.
    """

    def __init__(self, root: Path, prefix: list[str]):
        self.root = root
        self.prefix = prefix
        admin = root / "var" / "lib" / "dpkg"
        for sub in ("info", "updates", "triggers"):
            (admin / sub).mkdir(parents=True, exist_ok=True)
        (admin / "status").touch()

    def dpkg(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [*self.prefix, "dpkg", f"--root={self.root}", "--log=/dev/null", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{cmd}:\n{r.stdout}\n{r.stderr}"
        return r

    def install(self, deb: Path) -> None:
        self.dpkg("--force-depends", "-i", str(deb))

    def purge(self, package: str) -> None:
        self.dpkg("--purge", package)

    def files(self) -> list[str]:
        """Everything outside dpkg's own database, relative to the root."""
        out = []
        for dirpath, dirs, files in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root)
            if rel.parts[:3] == ("var", "lib", "dpkg"):
                continue
            out += [str(rel / f) for f in files]
            out += [str(rel / d) for d in dirs if (Path(dirpath) / d).is_symlink()]
        return sorted(out)


@pytest.fixture()
def dpkg_root(tmp_path):
    if shutil.which("dpkg") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg is not available (not a Debian/Ubuntu system)")
    prefix: list[str] = []
    if os.geteuid() != 0:
        # dpkg must own files as root; CI runners have password-less sudo.
        ok = shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"]).returncode == 0
        if not ok:
            pytest.skip("installing a .deb, even into a scratch root, needs root or sudo -n")
        prefix = ["sudo", "-n"]
    return DpkgRoot(tmp_path / "root", prefix)
