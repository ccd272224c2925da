"""Fuzzing with hypothesis: random markdown/HTML at the chat bubble, random header values at the
GGUF loader. Each runs in a child process under an address-space limit (a regression that reads
/dev/zero or sizes a table by a huge header then fails this test instead of exhausting the
machine) and a time limit."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import TESTS

HERE = Path(__file__).resolve().parent
MEMORY_LIMIT = 6 << 30  # address space of the child: torch and Qt map ~3 GiB at import
TIME_LIMIT_S = 240


def _run_child(function: str, *args: str) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    code = (
        f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(TESTS)!r}]; "
        f"import {Path(__file__).stem} as m; m.{function}(*sys.argv[1:])"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
        preexec_fn=limit,
        env=env,
        cwd=HERE.parent,
    )


# ---- the bubble renderer --------------------------------------------------------------------
PIECES = [
    "![",
    "](",
    ")",
    "[",
    "]",
    "<img src=",
    "<a href=",
    "<font color=red>",
    "</font>",
    "<table>",
    "<script>",
    "file:///dev/zero",
    "file:///etc/passwd",
    "/etc/passwd",
    "../secret.png",
    "https://example.com/x.png",
    "javascript:alert(1)",
    "smb://host/x",
    "`",
    "```",
    "\n",
    " ",
    "**",
    "# ",
    "- ",
    "> ",
    "|",
    "x",
    "é",
    "\u0000",
    "\udce9",
    "&lt;",
    "&#x2F;",
    '"',
    "'",
]


def fuzz_renderer(examples: str) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QTextDocument
    from PySide6.QtWidgets import QApplication

    from kvscope.app.desktop.chat.markdown_view import MarkdownView

    app = QApplication.instance() or QApplication([])
    view = MarkdownView()
    view.resize(400, 300)
    view.show()
    texts = st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=40).map("".join)

    @settings(max_examples=int(examples), deadline=None, database=None)
    @given(texts)
    def render(text: str) -> None:
        view.set_markdown(text)
        view.grab()
        app.processEvents()
        document = view.document()
        block = document.begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fmt = it.fragment().charFormat()
                assert not fmt.isImageFormat(), text
                if fmt.isAnchor():
                    url = QUrl(fmt.anchorHref())
                    assert document.resource(QTextDocument.ImageResource, url) is None
                it += 1
            block = block.next()

    render()
    print("ok")


def test_fuzz_the_bubble_renderer():
    done = _run_child("fuzz_renderer", "150")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


# ---- GGUF headers ---------------------------------------------------------------------------
KEYS = [
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
]


def fuzz_gguf_headers(examples: str, folder: str) -> None:
    import gguf
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from tiny_models import make_tiny_gguf

    from kvscope.engine.model.loader import load_model
    from kvscope.engine.sizing.planner import plan_kv

    src, _ = make_tiny_gguf("llama", Path(folder) / "src.gguf")
    reader = gguf.GGUFReader(src)
    values = st.one_of(
        st.sampled_from([0, 1, 2, 3, 64, 128, 2**31, 2**32 - 1]),
        st.integers(0, 2**32 - 1),
    )
    outcomes: dict[str, int] = {}

    @settings(max_examples=int(examples), deadline=None, database=None)
    @given(st.dictionaries(st.sampled_from(KEYS), values, min_size=1))
    def load(overrides: dict) -> None:
        path = Path(folder) / "fuzz.gguf"
        writer = gguf.GGUFWriter(path, "llama")
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name == "general.architecture":
                continue
            value = overrides.get(field.name, field.contents())
            sub = field.types[-1] if len(field.types) > 1 else None
            writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
        for t in reader.tensors:
            shape = list(reversed(t.shape.tolist()))
            writer.add_tensor(t.name, np.array(t.data), raw_shape=shape, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        for attempt in (lambda: load_model(path), lambda: plan_kv(path, context=64)):
            try:
                attempt()
                outcomes["loaded"] = outcomes.get("loaded", 0) + 1
            except ValueError:  # the only acceptable failure: a clear refusal
                outcomes["refused"] = outcomes.get("refused", 0) + 1

    load()
    print(json.dumps(outcomes))


def test_fuzz_gguf_header_values(tmp_path):
    done = _run_child("fuzz_gguf_headers", "40", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcomes.get("refused", 0) > 0  # the fuzzer did reach the checks


@pytest.fixture(autouse=True)
def _linux_only():
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS and fork-based limits: Linux")
