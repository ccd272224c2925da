"""Build the llama.cpp peer for the benchmarks: `llama-server` and the libraries that
llama-cpp-python loads, from the llama.cpp sources inside llama-cpp-python's sdist, with cmake.

One build serves both: `kvscope bench --peer llama.cpp` imports llama-cpp-python's pure-Python
package (copied beside the libraries, put on the venv's path by a .pth file) and
`kvscope bench --serve --peer-server` runs `llama-server`. Nothing here is imported by the app or
the engine; it is an optional benchmark dependency (`make peer`).

The instruction set is named explicitly from this CPU's flags rather than `-march=native`: on a VM
the native build may emit instructions the hypervisor forbids ("Illegal instruction").
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from kvscope.app.bench.cpu_model import cpu_flags

VERSION = "0.3.36"
# CPU flag in /proc/cpuinfo -> the ggml option that uses it.
GGML_FLAGS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
# Off even where the CPU has them: on the Xeon VM this was built on (AMX usable: a C program that
# asks for the tile permission runs tilezero), ggml 0.25.3's AMX matmul died of "Illegal
# instruction" in tinygemm_kernel_amx at the first prompt, in llama-server and llama-cpp-python.
OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
TARGETS = ("llama-server", "llama")


def cmake_options(flags: set[str]) -> list[str]:
    options = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
    ]
    wanted = [f"-D{option}={'ON' if cpu in flags else 'OFF'}" for cpu, option in GGML_FLAGS.items()]
    return options + wanted + [f"-D{option}=OFF" for option in OFF]


def peer_dir(root: Path) -> Path:
    return root / f"llama-cpp-{VERSION}"


def server_binary(root: Path) -> Path:
    return peer_dir(root) / "build" / "bin" / "llama-server"


def fetch_sources(root: Path) -> Path:
    sources = peer_dir(root) / f"llama_cpp_python-{VERSION}"
    if (sources / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return sources
    peer_dir(root).mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
    subprocess.run([*pip, f"llama-cpp-python=={VERSION}", "-d", str(peer_dir(root))], check=True)
    with tarfile.open(peer_dir(root) / f"llama_cpp_python-{VERSION}.tar.gz") as sdist:
        sdist.extractall(peer_dir(root), filter="data")
    return sources


def build(root: Path, jobs: int) -> Path:
    sources = fetch_sources(root)
    build_dir = peer_dir(root) / "build"
    configure = ["cmake", "-S", str(sources / "vendor" / "llama.cpp"), "-B", str(build_dir)]
    subprocess.run([*configure, *cmake_options(cpu_flags())], check=True)
    targets = [arg for target in TARGETS for arg in ("--target", target)]
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(jobs), *targets], check=True)
    install_python_package(sources, build_dir / "bin", peer_dir(root) / "python")
    return server_binary(root)


def install_python_package(sources: Path, libs: Path, into: Path) -> None:
    """llama-cpp-python's Python files with our libraries in its lib/, on the venv's path."""
    package = into / "llama_cpp"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(sources / "llama_cpp", package)
    (package / "lib").mkdir(exist_ok=True)
    for lib in libs.glob("lib*.so*"):
        shutil.copy2(lib, package / "lib" / lib.name)
    site = Path(sysconfig.get_paths()["purelib"])
    (site / "kvscope-llama-cpp-peer.pth").write_text(f"{into}\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "diskcache>=5.6.1"], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvscope.app.bench.llama_cpp.build")
    parser.add_argument("--root", default=".cache", help="where the sources and the build go")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    print(build(Path(args.root).resolve(), args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
