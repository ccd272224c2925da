"""The Windows installer script compiles with makensis (`nsis`) around a stand-in bundle."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NSI = ROOT / "packaging" / "windows" / "kvscope.nsi"
MAKENSIS = shutil.which("makensis")

sys.path.insert(0, str(ROOT / "packaging"))
from project_version import numeric_version, project_version  # noqa: E402

needs_makensis = pytest.mark.skipif(
    MAKENSIS is None,
    reason="makensis is not installed (Debian/Ubuntu: apt-get install nsis; `make setup` does)",
)


def stand_in_bundle(root: Path) -> Path:
    """What PyInstaller leaves in dist/kvscope on Windows, in miniature."""
    bundle = root / "kvscope"
    (bundle / "_internal" / "torch" / "lib").mkdir(parents=True)
    (bundle / "kvscope.exe").write_bytes(b"MZ" + b"\0" * 510)
    (bundle / "_internal" / "python311.dll").write_bytes(b"MZ" + b"\1" * 2000)
    (bundle / "_internal" / "torch" / "lib" / "c10.dll").write_bytes(b"MZ" + b"\2" * 2000)
    return bundle


def makensis(*defines: str) -> subprocess.CompletedProcess:
    # -WX: a warning (an unused define, a missing file) fails the build like an error would.
    cmd = [MAKENSIS, "-V2", "-WX", *(f"-D{d}" for d in defines), str(NSI)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@needs_makensis
def test_installer_compiles_around_a_stand_in_bundle(tmp_path):
    bundle = stand_in_bundle(tmp_path)
    out = tmp_path / "KVScope-setup.exe"
    version = project_version()
    r = makensis(
        f"VERSION={version}",
        f"VERSION_NUMERIC={numeric_version(version)}",
        f"SRCDIR={bundle}",
        f"OUTFILE={out}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = out.read_bytes()
    assert data[:2] == b"MZ", "not a Windows executable"
    # The version strings go into the installer's version resource (UTF-16).
    assert version.encode("utf-16-le") in data


@needs_makensis
def test_version_without_numeric_form_still_compiles(tmp_path):
    bundle = stand_in_bundle(tmp_path)
    r = makensis(
        "VERSION=1.2.3rc1", f"SRCDIR={bundle}", f"OUTFILE={tmp_path / 'KVScope-test-installer.exe'}"
    )
    assert r.returncode == 0, r.stdout + r.stderr


@needs_makensis
def test_missing_version_is_a_clear_error(tmp_path):
    r = makensis(
        f"SRCDIR={stand_in_bundle(tmp_path)}", f"OUTFILE={tmp_path / 'KVScope-test-installer.exe'}"
    )
    assert r.returncode != 0
    assert "pass the version" in r.stdout + r.stderr


def test_installer_is_per_user_and_uninstalls_only_its_own_files():
    text = NSI.read_text(encoding="utf-8")
    assert "RequestExecutionLevel user" in text
    assert 'InstallDir "$LOCALAPPDATA\\Programs\\${APPNAME}"' in text
    assert "HKLM" not in text, "a per-user install must not write machine-wide registry keys"
    assert '"$DESKTOP\\${APPNAME}.lnk"' in text and "$SMPROGRAMS" in text
    uninstall = text.split('Section "Uninstall"', 1)[1]
    assert 'RMDir /r "$INSTDIR"' not in uninstall  # would empty a folder the user chose


@pytest.mark.parametrize(
    ("version", "numeric"),
    [("0.1.0", "0.1.0.0"), ("1.2", "1.2.0.0"), ("2.0.1rc1", "2.0.1.0"), ("3.1b2", "3.1.0.0")],
)
def test_numeric_version(version, numeric):
    assert numeric_version(version) == numeric


def test_project_version_matches_pyproject():
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project_version() == pyproject["project"]["version"]
