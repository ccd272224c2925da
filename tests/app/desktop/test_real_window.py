"""The window on a real X server (Xvfb), through Qt's xcb platform as on a desktop session.

The rest of the suite runs offscreen, which needs fewer system libraries: a missing xcb
dependency would pass every other test and still give a user no window at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_paths import REPO as ROOT

from kvscope.engine.child_python import python_module_command

QT_PLUGINS = Path(__import__("PySide6").__file__).parent / "Qt" / "plugins" / "platforms"

needs_x = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not shutil.which("Xvfb") or not shutil.which("xdotool"),
    reason="needs Linux with Xvfb and xdotool (make setup installs them with apt)",
)


def test_makefile_installs_what_the_deb_depends_on():
    sys.path.insert(0, str(ROOT / "packaging" / "linux"))
    try:
        from build_linux import DEPENDS
    finally:
        sys.path.pop(0)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    block = re.search(r"^QT_APT_LIBS := (.*?)\n(?!\t)", makefile, re.S | re.M).group(1)
    installed = set(block.replace("\\", " ").split())
    # "a | b" alternatives name one package under two distribution releases.
    missing = [d for d in DEPENDS if not installed & {a.strip() for a in d.split("|")}]
    assert not missing, f"the .deb needs {missing}, `make setup` does not install them"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ldd is Linux's")
def test_xcb_platform_plugin_finds_its_libraries():
    plugin = QT_PLUGINS / "libqxcb.so"
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    assert not missing, f"Qt's xcb plugin cannot load: {missing} not found (run `make setup`)"


@pytest.fixture
def xvfb():
    read, write = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1400x900x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    with os.fdopen(read) as f:
        display = f":{f.readline().strip()}"
    yield display
    server.terminate()
    server.wait(timeout=10)


@pytest.mark.slow
@needs_x
def test_window_opens_on_a_real_x_server(xvfb, tmp_path):
    shot = tmp_path / "window.png"
    env = {
        **os.environ,
        "DISPLAY": xvfb,
        "QT_QPA_PLATFORM": "xcb",
        "KVSCOPE_DATA_DIR": str(tmp_path / "data"),
    }
    app = subprocess.Popen(
        python_module_command("kvscope.app.cli", "--screenshot", str(shot)),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    deadline = time.monotonic() + 240
    while app.poll() is None and time.monotonic() < deadline:
        found = subprocess.run(
            ["xdotool", "search", "--onlyvisible", "--name", "^KVScope$"],
            env=env,
            capture_output=True,
            text=True,
        )
        seen += found.stdout.split()
        if seen:  # ask while the window still exists: the app exits after its screenshot
            geometry = subprocess.run(
                ["xdotool", "getwindowgeometry", seen[0]], env=env, capture_output=True, text=True
            ).stdout
            break
        time.sleep(0.5)
    try:
        app.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        app.kill()
    log = app.communicate()[0]
    assert "Could not load the Qt platform plugin" not in log, log
    assert seen, f"no visible KVScope window appeared on {xvfb}:\n{log}"
    width, height = map(int, re.search(r"Geometry: (\d+)x(\d+)", geometry).groups())
    assert width >= 800 and height >= 500, geometry
    assert app.returncode == 0, log
    assert shot.stat().st_size > 10_000
