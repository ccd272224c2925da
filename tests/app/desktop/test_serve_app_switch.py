"""Engine ▸ Serve the engine: the window's own engine answers OpenAI clients, and their
requests appear on the block map's telemetry under their client's label."""

from __future__ import annotations

import socket

import openai
import pytest

pytestmark = pytest.mark.slow  # a real window and engine, on the bundled model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_window_serves_its_engine(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KVSCOPE_SERVE_PORT", str(_free_port()))
    monkeypatch.delenv("KVSCOPE_API_KEY", raising=False)
    window = make_window()
    window.server.action.trigger()
    qtbot.waitUntil(lambda: bool(window.server.url), timeout=30_000)
    assert window.server.action.isChecked()
    client = openai.OpenAI(base_url=window.server.url, api_key="-", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=40,
        temperature=0,
        stream=True,
        user="editor",
    )
    pieces = []
    seen_on_map = False
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        qtbot.wait(1)  # let the window take in telemetry between chunks
        telemetry = window.last_telemetry
        if telemetry is not None and any(
            s.request_id.startswith("api-editor/") for s in telemetry.paged.sequences
        ):
            seen_on_map = True
    assert "".join(pieces)
    qtbot.waitUntil(lambda: seen_on_map or _seen(window), timeout=10_000)
    window.server.action.trigger()
    qtbot.waitUntil(lambda: not window.server.url, timeout=30_000)
    assert not window.server.action.isChecked()
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def _seen(window) -> bool:
    telemetry = window.last_telemetry
    return telemetry is not None and any(
        s.request_id.startswith("api-editor/") for s in telemetry.paged.sequences
    )
