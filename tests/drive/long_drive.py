"""The long drive: the real window, driven as a user for MINUTES minutes, measured as it goes.

`make drive` (MINUTES=60) or `python tests/drive/long_drive.py --minutes 5 --out drive_out`.
The window is app/desktop/launch.py's: a QApplication named KVScope with the icon, then
MainWindow on the user's settings (here a fresh data folder: a new user) and the bundled model.
A loop of scenarios (tests/drive/scenarios.py: chat, a code question, a model switch and back,
regenerate, n=3, search, export, the load generator, record and replay, the theme) runs until
the time is up; RSS is sampled every 10 s, the GUI thread's stalls over 200 ms are logged with
their cause, and every error a user would see is recorded (tests/drive/monitors.py). At the end
the window is shot in both themes at 1024x700 and 1400x860, closed with Chat ▸ Quit, and the results
go to OUT: drive.json, rss.png, shot-*.png, exports/. Exit status: 0 when no error was recorded,
1 when one was, 2 when the drive itself could not run. No process outlives it: the X server it
starts dies with it (PR_SET_PDEATHSIG), and any child left after the window closed is listed in
the JSON and ended.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tests")]  # the drive's modules, tiny_models
DATA_MARK = ".kvscope-drive-data"  # a data folder the drive made, so it may clear it
OTHER_SHAPE = ("drive-0.4B", 24, 1280, 3584, 20, 4)  # ~330 MB Q4_K_M, llama.cpp's recipe
MODEL_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "kvscope-drive-models"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=60.0,
        help="how long the scenario loop runs; 0: each scenario once",
    )
    p.add_argument("--out", type=Path, default=ROOT / "drive_out")
    p.add_argument(
        "--display",
        choices=("auto", "xvfb", "offscreen"),
        default="auto",
        help="xvfb: Qt's xcb on an Xvfb it starts (auto: when installed)",
    )
    p.add_argument(
        "--other-model",
        choices=("synthetic", "tiny", "none"),
        default="synthetic",
        help="the model switched to and back: a ~330 MB synthetic GGUF built once "
        f"into {MODEL_CACHE}, a tiny test GGUF, or none",
    )
    p.add_argument("--data-dir", type=Path, help="KVSCOPE_DATA_DIR (default: a fresh OUT/data)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="a lasting cache (the converted tokenizer, the compiled kernels) linked "
        "as DATA/cache: a returning user's warm start; default: a new user's cold one",
    )
    p.add_argument("--only", help="comma-separated scenario names to run (default: all of them)")
    p.add_argument("--max-tokens", type=int, default=64, help="each chat's max tokens")
    p.add_argument("--load-seconds", type=float, default=30.0)
    p.add_argument("--rss-every", type=float, default=10.0, help="seconds between RSS samples")
    return p.parse_args(argv)


def _die_with_parent() -> None:
    """In the X server's child: SIGTERM when the drive dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_xvfb() -> tuple[subprocess.Popen, str]:
    read, write = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1400x900x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    os.close(write)
    with os.fdopen(read) as f:
        display = f.readline().strip()
    if not display:
        server.kill()
        raise RuntimeError("Xvfb started but gave no display number")
    return server, f":{display}"


def fresh_data_dir(path: Path) -> Path:
    """A new user's data folder; one the drive made before is cleared, nothing else is."""
    if path.exists():
        if not (path / DATA_MARK).is_file():
            raise SystemExit(f"{path} exists and is not a drive's data folder: pass another")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / DATA_MARK).write_text("made by tests/drive/long_drive.py\n")
    return path


def other_model(kind: str, out: Path) -> str | None:
    """The GGUF the drive switches to, built before the window opens (not a GUI stall)."""
    if kind == "none":
        return None
    if kind == "tiny":
        from tiny_models import make_quant_gguf

        return str(make_quant_gguf(out / "tiny-q8.gguf", "Q8_0"))
    from kvscope.engine.bench.synthetic_gguf import Shape, ensure_synthetic_gguf

    return str(ensure_synthetic_gguf(Shape(*OTHER_SHAPE), MODEL_CACHE))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("shot-*.png"):
        old.unlink()
    data = fresh_data_dir(args.data_dir or out / "data")
    if args.cache_dir:
        args.cache_dir.mkdir(parents=True, exist_ok=True)
        (data / "cache").symlink_to(args.cache_dir.resolve(), target_is_directory=True)
    os.environ["KVSCOPE_DATA_DIR"] = str(data)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    xvfb = None
    use_x = args.display == "xvfb" or (args.display == "auto" and shutil.which("Xvfb"))
    if use_x:
        xvfb, display = start_xvfb()
        os.environ.update(DISPLAY=display, QT_QPA_PLATFORM="xcb")
    else:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    faulthandler.enable()  # a crash prints every thread's stack
    # A hang anywhere (a dialog nobody answers) ends the drive with every thread's stack.
    hard_limit = args.minutes * 60 + 1800
    faulthandler.dump_traceback_later(hard_limit, exit=True)
    try:
        model = other_model(args.other_model, out)
        from drive_run import run_drive

        return run_drive(args, out, model, os.environ["QT_QPA_PLATFORM"])
    finally:
        faulthandler.cancel_dump_traceback_later()
        if xvfb is not None:
            xvfb.terminate()
            try:
                xvfb.wait(10)
            except subprocess.TimeoutExpired:
                xvfb.kill()


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"[drive] done in {time.monotonic() - started:.0f} s, exit status {code}", flush=True)
    sys.exit(code)
