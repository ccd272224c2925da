"""Strip the symbol tables from a Linux bundle's shared libraries, safely.

PyInstaller's own `strip=True` runs `strip` on every binary and trusts the result. Libraries that
auditwheel/patchelf rewrote (numpy's OpenBLAS, Pillow's libs, ...) come back from some binutils
versions with LOAD segments whose file offset and address disagree modulo the page size, and
the dynamic loader then refuses them ("ELF load command address/offset not page-aligned"). Here
each file is stripped to a copy, the copy's program headers are checked, and only a valid, smaller
copy replaces the original.

    python packaging/elf_strip.py dist/kvscope         # strip in place, print a summary
    python packaging/elf_strip.py dist/kvscope --check # only report invalid LOAD segments
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

ELF_MAGIC = b"\x7fELF"
PT_LOAD = 1
SHT_SYMTAB = 2
PAGE = 4096


def _header(data: bytes):
    if data[:4] != ELF_MAGIC:
        return None
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        phoff, shoff = struct.unpack_from(end + "QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", data, 0x36)
    else:
        phoff, shoff = struct.unpack_from(end + "II", data, 0x1C)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", data, 0x2A)
    return is64, end, phoff, phentsize, phnum, shoff, shentsize, shnum


def load_segments_valid(path: Path) -> bool:
    """Every PT_LOAD has offset == vaddr modulo its alignment and modulo the page size."""
    data = path.read_bytes()
    h = _header(data)
    if h is None:
        return False
    is64, end, phoff, phentsize, phnum, *_ = h
    loads = 0
    for i in range(phnum):
        off = phoff + i * phentsize
        if is64:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
            f = struct.unpack_from(end + "IIQQQQQQ", data, off)
            p_type, p_offset, p_vaddr, p_align = f[0], f[2], f[3], f[7]
        else:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
            f = struct.unpack_from(end + "IIIIIIII", data, off)
            p_type, p_offset, p_vaddr, p_align = f[0], f[1], f[2], f[7]
        if p_type != PT_LOAD:
            continue
        loads += 1
        for align in {max(p_align, 1), PAGE}:
            if p_offset % align != p_vaddr % align:
                return False
    return loads > 0


def has_symtab(path: Path) -> bool:
    """Whether the file still carries a .symtab (i.e. is not stripped yet)."""
    with open(path, "rb") as f:
        data = f.read()
    h = _header(data)
    if h is None:
        return False
    is64, end, _phoff, _phentsize, _phnum, shoff, shentsize, shnum = h
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + 8 > len(data):
            return False
        (sh_type,) = struct.unpack_from(end + "I", data, off + 4)
        if sh_type == SHT_SYMTAB:
            return True
    return False


def elf_files(root: Path) -> list[Path]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            with open(p, "rb") as f:
                if f.read(4) == ELF_MAGIC:
                    out.append(p)
    return sorted(out)


def strip_tree(root: Path, strip: str = "strip") -> dict:
    """Strip every unstripped ELF file under root that stays valid; return what happened."""
    report = {"stripped": 0, "saved_bytes": 0, "kept_invalid": [], "already_stripped": 0}
    for p in elf_files(root):
        if not has_symtab(p):
            report["already_stripped"] += 1
            continue
        tmp = p.with_name(p.name + ".kvscope-strip")
        r = subprocess.run([strip, "--strip-unneeded", "-o", str(tmp), str(p)], capture_output=True)
        try:
            if r.returncode != 0 or not load_segments_valid(tmp):
                report["kept_invalid"].append(str(p.relative_to(root)))
                continue
            before, after = p.stat().st_size, tmp.stat().st_size
            if after < before:
                shutil.copymode(p, tmp)
                os.replace(tmp, p)
                report["stripped"] += 1
                report["saved_bytes"] += before - after
        finally:
            tmp.unlink(missing_ok=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--check", action="store_true", help="only list files with invalid LOADs")
    args = ap.parse_args(argv)
    if args.check:
        bad = [p for p in elf_files(args.bundle) if not load_segments_valid(p)]
        for p in bad:
            print(f"invalid LOAD segments: {p}")
        return 1 if bad else 0
    if shutil.which("strip") is None:
        print("error: strip not found (install binutils)", file=sys.stderr)
        return 2
    r = strip_tree(args.bundle)
    print(
        f"stripped {r['stripped']} files (-{r['saved_bytes'] / 2**20:.0f} MiB), "
        f"{r['already_stripped']} were already, {len(r['kept_invalid'])} kept unstripped "
        f"because stripping broke them: {r['kept_invalid']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
