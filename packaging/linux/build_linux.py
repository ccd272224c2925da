"""Turn the PyInstaller bundle into Linux installers: a .deb and a .tar.gz, both in dist/.

    python packaging/linux/build_linux.py [--bundle dist/kvscope] [--out dist]

.deb (dpkg-deb, no maintainer scripts; desktop-file-utils and hicolor-icon-theme refresh their
caches through dpkg triggers):
    /opt/kvscope/                                  the bundle (kvscope + _internal/)
    /usr/bin/kvscope -> ../../opt/kvscope/kvscope  the launcher on PATH (relative, so it also
                                                   works in a throwaway --instdir root)
    /usr/share/applications/kvscope.desktop
    /usr/share/icons/hicolor/256x256/apps/kvscope.png
    /usr/share/doc/kvscope/copyright
.tar.gz: kvscope-VERSION/ holding the bundle plus kvscope.desktop and kvscope.png.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

from glibc_floor import report as elf_report  # noqa: E402
from project_version import project_version  # noqa: E402

PACKAGE = "kvscope"
INSTALL_DIR = "opt/kvscope"
# Shared libraries the bundled Qt (xcb and wayland platform plugins, OpenGL, fonts, D-Bus) loads
# from the system; `packaging/glibc_floor.py dist/kvscope --needed` lists what the bundle expects.
# PySide6 6.8+ wheels need glibc 2.34; the bundle's measured floor replaces this when higher.
MIN_GLIBC = "2.34"
DEPENDS = [
    "libgl1",
    "libegl1",
    "libfontconfig1",
    "libfreetype6",
    "libglib2.0-0 | libglib2.0-0t64",
    "libxkbcommon0",
    "libxkbcommon-x11-0",
    "libdbus-1-3",
    "libx11-6",
    "libx11-xcb1",
    "libxcb1",
    "libxcb-cursor0",
    "libxcb-icccm4",
    "libxcb-image0",
    "libxcb-keysyms1",
    "libxcb-randr0",
    "libxcb-render-util0",
    "libxcb-shape0",
    "libxcb-xinerama0",
    "libxcb-xkb1",
]
DESCRIPTION = """\
Local LLM chat with a live map of its paged KV cache
 KVScope is a desktop chat app built on its own paged-attention inference
 engine (continuous batching, prefix caching, preemption) and draws the
 engine's KV-cache block pool live. SmolLM2-135M-Instruct is bundled, so it
 works offline; it also opens Llama-family GGUF files and HF model folders.
 User data lives in the user's data dir (~/.local/share/KVScope), never in
 /opt/kvscope."""
DESKTOP = """\
[Desktop Entry]
Type=Application
Name=KVScope
GenericName=LLM chat and KV-cache viewer
Comment=Chat with a local language model and watch its KV cache
Exec=kvscope
Icon=kvscope
Terminal=false
Categories=Development;Science;
Keywords=LLM;chat;KV cache;paged attention;
StartupWMClass=kvscope
"""
COPYRIGHT = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: KVScope
License: Apache-2.0

Files: *
License: Apache-2.0
Comment: /opt/kvscope bundles third-party software under its own licenses (Python, Qt/PySide6
 under LGPL-3.0, PyTorch, transformers, SmolLM2-135M-Instruct under Apache-2.0, ...); their
 license files travel inside /opt/kvscope/_internal.
"""


def deb_arch() -> str:
    try:
        return subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def dir_size_kib(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                total += p.stat().st_size
    return (total + 1023) // 1024


def normalise_modes(root: Path) -> None:
    """0755 for folders and executables, 0644 for everything else (dpkg-deb checks folders)."""
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            p = Path(dirpath) / d
            if not p.is_symlink():
                p.chmod(0o755)
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            p.chmod(0o755 if p.stat().st_mode & 0o111 else 0o644)
    root.chmod(0o755)


# dpkg-deb compressor and level: xz is what every dpkg reads and the smallest; zstd is ~10x faster
# to build for ~12% more bytes (dpkg >= 1.21.18: Debian 12, Ubuntu 22.04 and later).
COMPRESSION = {"xz": ["-Zxz", "-z6"], "zstd": ["-Zzstd", "-z9"], "gzip": ["-Zgzip", "-z6"]}


def build_deb(bundle: Path, out: Path, version: str, work: Path, compression: str = "xz") -> Path:
    stage = work / "deb"
    app_dir = stage / INSTALL_DIR
    shutil.copytree(bundle, app_dir, symlinks=True)
    (stage / "usr/bin").mkdir(parents=True)
    os.symlink(f"../../{INSTALL_DIR}/kvscope", stage / "usr/bin/kvscope")
    apps = stage / "usr/share/applications"
    apps.mkdir(parents=True)
    (apps / "kvscope.desktop").write_text(DESKTOP, encoding="utf-8")
    icons = stage / "usr/share/icons/hicolor/256x256/apps"
    icons.mkdir(parents=True)
    shutil.copy2(ROOT / "assets/kvscope.png", icons / "kvscope.png")
    doc = stage / "usr/share/doc/kvscope"
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(COPYRIGHT, encoding="utf-8")
    normalise_modes(stage)

    glibc = MIN_GLIBC
    if shutil.which("objdump"):
        measured = elf_report(bundle)["floor"].get("GLIBC")
        if measured and _vkey(measured) > _vkey(glibc):
            glibc = measured
    arch = deb_arch()
    control = stage / "DEBIAN"
    control.mkdir()
    fields = {
        "Package": PACKAGE,
        "Version": version,
        "Architecture": arch,
        "Maintainer": "KVScope developers <kvscope@users.noreply.github.com>",
        "Installed-Size": str(dir_size_kib(stage)),
        "Depends": ", ".join([f"libc6 (>= {glibc})", *DEPENDS]),
        "Section": "science",
        "Priority": "optional",
        "Description": DESCRIPTION,
    }
    (control / "control").write_text(
        "".join(f"{k}: {v}\n" for k, v in fields.items()), encoding="utf-8"
    )
    control.chmod(0o755)
    (control / "control").chmod(0o644)

    deb = out / f"{PACKAGE}_{version}_{arch}.deb"
    # --root-owner-group: files owned by root in the package, whoever builds it
    cmd = ["dpkg-deb", "--root-owner-group", *COMPRESSION[compression], "--build"]
    subprocess.run([*cmd, str(stage), str(deb)], check=True)
    return deb


def build_tarball(bundle: Path, out: Path, version: str) -> Path:
    top = f"{PACKAGE}-{version}"
    tgz = out / f"{PACKAGE}-{version}-linux-{platform.machine()}.tar.gz"

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(tgz, "w:gz", compresslevel=6) as tar:
        tar.add(bundle, arcname=top, filter=owned_by_root)
        tar.add(ROOT / "assets/kvscope.png", arcname=f"{top}/kvscope.png", filter=owned_by_root)
        info = owned_by_root(tarfile.TarInfo(f"{top}/kvscope.desktop"))
        # Exec=kvscope expects the folder's kvscope on PATH (or edit Exec= to the full path).
        data = DESKTOP.encode()
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return tgz


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the .deb and .tar.gz from the bundle.")
    ap.add_argument("--bundle", type=Path, default=ROOT / "dist/kvscope")
    ap.add_argument("--out", type=Path, default=ROOT / "dist")
    ap.add_argument("--version", default=None, help="default: pyproject.toml's")
    ap.add_argument(
        "--deb-compression",
        choices=sorted(COMPRESSION),
        default=os.environ.get("DEB_COMPRESSION", "xz"),
        help="dpkg-deb compressor (default xz, or $DEB_COMPRESSION)",
    )
    ap.add_argument("--skip-deb", action="store_true")
    ap.add_argument("--skip-tar", action="store_true")
    args = ap.parse_args(argv)
    exe = args.bundle / "kvscope"
    if not exe.is_file():
        print(f"error: {exe} not found; build the bundle first (make package)", file=sys.stderr)
        return 2
    version = args.version or project_version()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvscope-deb-", dir=args.out) as work:
        if not args.skip_deb:
            if shutil.which("dpkg-deb") is None:
                print("error: dpkg-deb not found (apt install dpkg)", file=sys.stderr)
                return 2
            deb = build_deb(args.bundle, args.out, version, Path(work), args.deb_compression)
            print(f"{deb}: {deb.stat().st_size / 2**20:.0f} MiB")
    if not args.skip_tar:
        tgz = build_tarball(args.bundle, args.out, version)
        print(f"{tgz}: {tgz.stat().st_size / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
