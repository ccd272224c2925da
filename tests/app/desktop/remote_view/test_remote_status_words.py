"""Issue 29: a remote replica's status line says what is wrong in words, with the raised text
in the tooltip, and sits on its own wrapped row, never cut off under the Disconnect button."""

from __future__ import annotations

import pytest

from kvscope.app.desktop.remote_view.status_line import BAD, StatusLine, plain_http_error

URL = "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        ("ConnectError: [Errno 111] Connection refused",
         "nothing is listening at http://127.0.0.1:8000: is the server running?"),
        ("ConnectError: [Errno -2] Name or service not known",
         "cannot find the host of http://127.0.0.1:8000: is the address right?"),
        ("ConnectTimeout: timed out", "http://127.0.0.1:8000 did not answer in time"),
        ("HTTP 401 from http://127.0.0.1:8000/metrics", "refused the API key"),
        ("HTTP 404 from http://127.0.0.1:8000/metrics", "has no /metrics"),
        ("RemoteProtocolError: Server disconnected without sending a response.",
         "closed the connection"),
    ],
)  # fmt: skip
def test_known_errors_are_said_in_words(raised, said):
    assert said in plain_http_error(raised, URL)


def test_an_unknown_error_is_kept_as_raised():
    assert plain_http_error("ValueError: odd", URL) == "ValueError: odd"


def test_the_card_wraps_a_long_status_below_the_button(qtbot):
    from kvscope.app.desktop.remote_view.replica_card import ReplicaCard

    card = ReplicaCard("127.0.0.1:8000", "#4C8DFF")
    qtbot.addWidget(card)
    card.resize(420, 300)  # taller than it needs: the spare height goes below
    card.show()
    words = plain_http_error("ConnectError: [Errno 111] Connection refused", URL)
    line = StatusLine("down", BAD, (words, "events: reconnecting"), ("HTTP error: ConnectError",))
    card.set_status(line, extra="model SmolLM2-135M-Instruct · 1,204 blocks")
    qtbot.wait(50)
    status, button = card.status.geometry(), card.disconnect_button.geometry()
    assert status.top() >= button.bottom()  # its own row: nothing lies over it
    assert status.right() <= card.width()
    needed = card.status.heightForWidth(status.width())
    assert needed <= status.height() < needed + card.fontMetrics().height()  # its lines, no gap
    assert status.height() > card.fontMetrics().height() * 1.5  # wrapped, not cut
    assert "HTTP error: ConnectError" in card.status.toolTip()
