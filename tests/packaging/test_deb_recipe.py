"""The .deb recipe on a stand-in bundle: layout, control fields, install and clean removal.

The real bundle goes through the same steps in test_bundle.py (`make package-test`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging" / "linux"))
import build_linux  # noqa: E402

# The Qt runtime libraries the issue names; the package must depend on every one.
QT_SYSTEM_LIBS = [
    "libgl1", "libegl1", "libfontconfig1", "libxkbcommon0", "libxkbcommon-x11-0", "libdbus-1-3",
    "libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-shape0", "libxcb-xinerama0",
]  # fmt: skip


@pytest.fixture()
def stand_in_deb(tmp_path):
    if subprocess.run(["which", "dpkg-deb"], capture_output=True).returncode != 0:
        pytest.skip("dpkg-deb is not available (not a Debian/Ubuntu system)")
    bundle = tmp_path / "bundle"
    (bundle / "_internal").mkdir(parents=True)
    exe = bundle / "kvscope"
    # Finds its _internal next to its real path, as the PyInstaller bootloader does.
    exe.write_text(
        '#!/bin/sh\nhere=$(dirname "$(readlink -f "$0")")\n'
        'cat "$here/_internal/payload.txt"; echo " $*"\n'
    )
    exe.chmod(0o755)
    (bundle / "_internal" / "payload.txt").write_text("stand-in bundle")
    out = tmp_path / "out"
    out.mkdir()
    return build_linux.build_deb(bundle, out, "9.8.7", tmp_path / "work")


def test_control_fields(stand_in_deb):
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(stand_in_deb)], capture_output=True, text=True, check=True
    ).stdout
    assert "Package: kvscope\n" in fields and "Version: 9.8.7\n" in fields
    depends = fields.split("Depends: ", 1)[1].split("\n", 1)[0]
    names = {alt.strip().split(" ")[0] for dep in depends.split(",") for alt in dep.split("|")}
    assert set(QT_SYSTEM_LIBS) <= names
    # No ELF files in the stand-in: the floor is PySide6's (the real bundle's is measured).
    assert f"libc6 (>= {build_linux.MIN_GLIBC})" in depends
    contents = subprocess.run(
        ["dpkg-deb", "-c", str(stand_in_deb)], capture_output=True, text=True, check=True
    ).stdout
    assert "./usr/bin/kvscope -> ../../opt/kvscope/kvscope" in contents
    for path in (
        "./opt/kvscope/kvscope",
        "./usr/share/applications/kvscope.desktop",
        "./usr/share/icons/hicolor/256x256/apps/kvscope.png",
    ):
        assert path in contents, path
    assert "root/root" in contents


def test_installs_runs_from_path_and_purges_clean(stand_in_deb, dpkg_root):
    dpkg_root.install(stand_in_deb)
    launcher = dpkg_root.root / "usr" / "bin" / "kvscope"
    out = subprocess.run([str(launcher), "--demo", "1"], capture_output=True, text=True)
    assert out.stdout.strip() == "stand-in bundle --demo 1"
    desktop = (dpkg_root.root / "usr/share/applications/kvscope.desktop").read_text()
    assert "Exec=kvscope" in desktop and "Icon=kvscope" in desktop
    dpkg_root.purge("kvscope")
    assert dpkg_root.files() == []
