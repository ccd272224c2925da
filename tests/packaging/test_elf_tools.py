"""The small ELF tools behind the Linux bundle: the glibc-floor report and the safe strip."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
import elf_strip  # noqa: E402
import glibc_floor  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("objdump") is None,
    reason="needs Linux ELF files and binutils (objdump, strip)",
)


@pytest.fixture()
def fake_bundle(tmp_path):
    """A folder with one real shared library (the interpreter's _ctypes extension)."""
    import _ctypes

    bundle = tmp_path / "bundle"
    (bundle / "_internal").mkdir(parents=True)
    shutil.copy2(_ctypes.__file__, bundle / "_internal" / "_ctypes.so")
    (bundle / "_internal" / "notes.txt").write_text("not an ELF file")
    return bundle


def test_glibc_floor_reads_required_symbol_versions(fake_bundle):
    r = glibc_floor.report(fake_bundle)
    assert r["elf_files"] == 1
    major, minor = (int(x) for x in r["floor"]["GLIBC"].split("."))
    assert major == 2 and minor >= 2
    assert r["set_by"]["GLIBC"] == ["_internal/_ctypes.so"]
    assert "libc.so.6" in r["external_sonames"]


def test_safe_strip_keeps_libraries_loadable(fake_bundle):
    lib = fake_bundle / "_internal" / "_ctypes.so"
    assert elf_strip.load_segments_valid(lib)
    elf_strip.strip_tree(fake_bundle)
    assert elf_strip.load_segments_valid(lib) and not elf_strip.has_symtab(lib)


def test_misaligned_load_segment_is_detected(fake_bundle, tmp_path):
    """What a broken strip produces: a LOAD whose offset and address disagree mod the page."""
    import struct

    lib = fake_bundle / "_internal" / "_ctypes.so"
    data = bytearray(lib.read_bytes())
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        off = phoff + i * phentsize
        if struct.unpack_from("<I", data, off)[0] == elf_strip.PT_LOAD:
            p_offset = struct.unpack_from("<Q", data, off + 8)[0]
            struct.pack_into("<Q", data, off + 8, p_offset + 8)
            break
    broken = tmp_path / "broken.so"
    broken.write_bytes(bytes(data))
    assert not elf_strip.load_segments_valid(broken)
