"""Connecting from the command line and the window: `kvscope --connect` pairs its flags in
order and refuses what it cannot use, naming it; the window grows a "Remote servers" tab with
the first connection (and loses it with the last), and closing it stops the monitors."""

from __future__ import annotations

import pytest

from kvscope.app.cli.main import build_parser, connections_from_args, main
from kvscope.app.remote.connection import parse_connection


def _parse(*argv: str):
    return connections_from_args(build_parser().parse_args(list(argv)))


def test_connect_flags_pair_in_order(monkeypatch):
    monkeypatch.delenv("KVSCOPE_API_KEY", raising=False)
    a, b = _parse(
        "--connect", "gpu-a:8000/v1", "--kv-events", "tcp://gpu-a:5557",
        "--kv-replay", "tcp://gpu-a:5558", "--connect", "https://gpu-b", "--api-key", "K",
    )  # fmt: skip
    assert (a.url, a.kv_events, a.kv_replay, a.api_key) == (
        "http://gpu-a:8000", "tcp://gpu-a:5557", "tcp://gpu-a:5558", "K"
    )  # fmt: skip
    assert (b.url, b.kv_events, b.api_key, b.label) == ("https://gpu-b", None, "K", "gpu-b")
    monkeypatch.setenv("KVSCOPE_API_KEY", "from-env")
    (c,) = _parse("--connect", "h:1")
    assert c.api_key == "from-env"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kv-events", "tcp://a:1"], "1 --kv-events for 0 --connect"),
        (["--connect", "ftp://h"], "must start with http:// or https://"),
        (["--connect", "h:1", "--kv-events", "tcp://nohost"], "needs a host and a port"),
        (["--connect", "h:1", "--connect", "h:1"], "the same server is given twice"),
        (
            [
                "--connect",
                "a:1",
                "--connect",
                "b:1",
                "--connect",
                "c:1",
                "--api-key",
                "x",
                "--api-key",
                "y",
            ],
            "2 --api-key for 3 --connect",
        ),  # fmt: skip
    ],
)
def test_bad_connect_flags_are_named_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_remote_tab_comes_and_goes_with_connections(make_window, qtbot):
    window = make_window()
    tabs = window.map_tabs
    assert tabs.count() == 1 and tabs.tabBar().isHidden()  # no connection: the map as before
    # A server that is not there: the view shows it down, the window stays responsive.
    window.connections.add(parse_connection("http://127.0.0.1:9", "tcp://127.0.0.1:9"))
    assert [tabs.tabText(i) for i in range(tabs.count())] == ["This engine", "Remote servers"]
    assert tabs.currentWidget() is window.remote_view and not tabs.tabBar().isHidden()
    qtbot.waitUntil(
        lambda: window.remote_view.status_text("127.0.0.1:9").startswith("down"), timeout=15_000
    )
    monitor = window.remote_view.monitors["127.0.0.1:9"]
    window.connections.remove("127.0.0.1:9")
    assert tabs.count() == 1 and window.remote_view.monitors == {}
    qtbot.waitUntil(lambda: not monitor.alive(), timeout=10_000)
