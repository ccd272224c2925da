"""The llama.cpp peer's build options (app/bench/llama_cpp/build.py): the instruction set named
from the CPU's flags, never -march=native, and AMX off even where the CPU lists it."""

from kvscope.app.bench.llama_cpp.build import cmake_options, server_binary


def test_the_options_follow_the_cpu_flags_and_keep_amx_off(tmp_path):
    avx2_only = cmake_options({"avx", "avx2", "fma", "f16c"})
    assert "-DGGML_NATIVE=OFF" in avx2_only and "-DBUILD_SHARED_LIBS=ON" in avx2_only
    assert "-DGGML_AVX2=ON" in avx2_only and "-DGGML_AVX512=OFF" in avx2_only
    xeon = cmake_options({"avx", "avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"})
    assert "-DGGML_AVX512=ON" in xeon and "-DGGML_AVX512_VNNI=ON" in xeon
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(xeon)
    assert not any(o.startswith("-DGGML_AMX") and o.endswith("=ON") for o in xeon)
    assert server_binary(tmp_path).name == "llama-server"
