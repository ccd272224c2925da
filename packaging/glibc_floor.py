"""The oldest glibc a Linux bundle runs on, and the system libraries it expects to find.

    python packaging/glibc_floor.py dist/kvscope            # floor + the files that set it
    python packaging/glibc_floor.py dist/kvscope --needed   # also: sonames not in the bundle
    python packaging/glibc_floor.py dist/kvscope --json

The floor is the highest GLIBC_x.y symbol version that any ELF file in the bundle requires
(`objdump -T`, from binutils, which PyInstaller needs on Linux anyway). A bundle built on a newer
distribution inherits that distribution's floor through the Python interpreter it copies, so
build releases on the oldest distribution you support (the release workflow uses ubuntu-22.04).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from elf_strip import elf_files  # packaging/ is on sys.path wherever this runs

VERSION_RE = re.compile(r"\b(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)\b")
NEEDED_RE = re.compile(r"^\s*NEEDED\s+(\S+)", re.M)


def _objdump(args: list[str], path: Path) -> str:
    r = subprocess.run(["objdump", *args, str(path)], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else ""


def required_versions(path: Path) -> dict[str, tuple[int, ...]]:
    """Highest version per family (GLIBC, GLIBCXX, CXXABI) among the symbols `path` imports."""
    best: dict[str, tuple[int, ...]] = {}
    for line in _objdump(["-T"], path).splitlines():
        # Imported symbols are undefined ("*UND*"); defined ones carry the file's own versions.
        if "*UND*" not in line:
            continue
        for family, ver in VERSION_RE.findall(line):
            v = tuple(int(x) for x in ver.split("."))
            if v > best.get(family, ()):
                best[family] = v
    return best


def needed_sonames(path: Path) -> list[str]:
    return NEEDED_RE.findall(_objdump(["-p"], path))


def report(root: Path) -> dict:
    files = elf_files(root)
    floor: dict[str, tuple[int, ...]] = {}
    setters: dict[str, list[str]] = {}
    bundled = {p.name for p in files} | {p.name for p in root.rglob("*") if p.is_symlink()}
    external: dict[str, list[str]] = {}
    for p in files:
        rel = str(p.relative_to(root))
        for family, v in required_versions(p).items():
            if v > floor.get(family, ()):
                floor[family], setters[family] = v, [rel]
            elif v == floor[family]:
                setters[family].append(rel)
        for so in needed_sonames(p):
            if so not in bundled:
                external.setdefault(so, []).append(rel)
    return {
        "bundle": str(root),
        "elf_files": len(files),
        "floor": {k: ".".join(map(str, v)) for k, v in sorted(floor.items())},
        "set_by": {k: sorted(v) for k, v in sorted(setters.items())},
        "external_sonames": {k: sorted(v) for k, v in sorted(external.items())},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="the one-folder bundle, e.g. dist/kvscope")
    ap.add_argument("--needed", action="store_true", help="list sonames the bundle does not hold")
    ap.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = ap.parse_args(argv)
    if shutil.which("objdump") is None:
        print("error: objdump not found (install binutils)", file=sys.stderr)
        return 2
    if not args.bundle.is_dir():
        print(f"error: {args.bundle} is not a folder", file=sys.stderr)
        return 2
    r = report(args.bundle)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['elf_files']} ELF files in {r['bundle']}")
    for family, v in r["floor"].items():
        who = r["set_by"][family]
        more = f" (+{len(who) - 3} more)" if len(who) > 3 else ""
        print(f"{family} >= {v}: required by {', '.join(who[:3])}{more}")
    if args.needed:
        print("system libraries expected on the host:")
        for so, users in r["external_sonames"].items():
            print(f"  {so}  ({len(users)} files, e.g. {users[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
