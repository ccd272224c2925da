"""The remote view, fed snapshots built from real KV event batches (app/remote/kv_wire.py types
through RemoteCache): the merged prefix tree attributes a shared branch to the replica that
holds it, status lines say down / restarted, tiles read /metrics, the routing box tokenizes off
the GUI thread, the Connect dialog shows parse_connection's error, and a screenshot is saved."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from PySide6.QtGui import QTextDocumentFragment
from remote_views import BS, SYSTEM, A, B, replica_caches, snapshot, status
from served import free_endpoint, start_server

from kvscope.app.desktop.remote_view import ConnectDialog, RemoteView, add_connect_action
from kvscope.app.desktop.remote_view.merged_tree import merge_trees
from kvscope.app.desktop.remote_view.prefix_tree import RUN_ROLE
from kvscope.app.remote.connection import parse_connection
from kvscope.app.remote.connections_qt import ConnectionList
from kvscope.app.remote.kv_wire import AllBlocksCleared, EventBatch
from kvscope.app.remote.metrics_scrape import RemoteMetrics
from kvscope.app.remote.remote_cache import RemoteCache


def runs_by_replicas(view) -> dict[tuple[str, ...], list]:
    out: dict[tuple[str, ...], list] = {}
    for item in view.tree.items():
        run = item.data(0, RUN_ROLE)
        out.setdefault(run.replicas, []).append(run)
    return out


def test_merging_matches_blocks_by_content_and_collapses_chains():
    a, b = replica_caches()
    roots = merge_trees([a, b])
    shared = roots[0]  # the system prompt, biggest subtree
    assert shared.replicas == (A, B) and shared.blocks == 10  # both hold its first 10 blocks
    assert shared.token_ids == tuple(SYSTEM[: 10 * BS])
    (rest,) = shared.children  # the other 30 are A's alone, one run, not 30 nodes
    assert (rest.replicas, rest.blocks, rest.depth_blocks) == ((A,), 30, 10)
    assert sorted(c.blocks for c in rest.children) == [3, 6]
    assert shared.held == {A: 49, B: 10} and shared.subtree_blocks == 49
    others = {r.token_ids[0]: r for r in roots[1:]}
    assert others[9000].replicas == (B,) and others[9000].blocks == 20
    assert others[7000].orphan and others[7000].blocks == 2  # parent 5555 never seen


def test_tree_attributes_the_shared_branch_and_status_lines_say_down_and_restart(
    two_replicas, tmp_path
):
    view, _connections, _snaps, _monitors = two_replicas
    runs = runs_by_replicas(view)
    # After B's restart it holds the system prompt's first 5 blocks again.
    (both,) = runs[(A, B)]
    assert both.blocks == 5 and both.token_ids[:3] == tuple(SYSTEM[:3])
    a_only = sorted(r.blocks for r in runs[(A,)])
    assert a_only == [3, 6, 35]  # the rest of the prompt is A's, as one 35-block bar
    assert [r.blocks for r in runs[(B,)]] == [20]
    caption = QTextDocumentFragment.fromHtml(view.tree_caption.text()).toPlainText()
    assert "69 distinct blocks in 5 branches · held: ■ gpu-a:8000 49 · ■ gpu-b:8000 25" in caption
    first = view.tree.items()[0]
    assert first.text(1) == f"{A}, {B}"
    assert first.text(2).startswith("1000 1001 1002")  # token ids: no detokenizer yet

    line_a = view.status_text(A)
    assert line_a.startswith("live") and "seq 812" in line_a
    line_b = view.status_text(B)
    assert line_b.startswith("down")
    # Said in words; the raised text stays in the tooltip (issue 29).
    assert "nothing is listening at http://gpu-b:8000: is the server running?" in line_b
    assert "[Errno 111]" not in line_b
    tip = view.cards[B].status.toolTip()
    assert "HTTP error: ConnectError: [Errno 111] Connection refused" in tip
    assert "1 restart (cache cleared)" in line_b and "2 malformed frames" in line_b

    tiles = view.cards[A].tiles_text()
    assert "KV USAGE: 25% (of 400 blocks)" in tiles
    assert "RUN · WAIT: 3 · 1" in tiles
    assert "PREFIX HITS: 60%" in tiles  # (700-100) / (1400-400) over the last 11 s
    assert "TTFT: 140 ms (mean over 11 s)" in tiles  # (3 * 0.1 - 2 * 0.08) s / 1 request
    assert "ITL: — (not in /metrics)" in tiles
    assert "TOKENS / S: 54.5" in tiles  # 600 tokens / 11 s
    assert "no /metrics yet" in view.cards[B].tiles_text()

    shot = tmp_path / "remote_view.png"
    assert view.grab().save(str(shot))
    assert shot.stat().st_size > 10_000


def test_a_detokenizer_turns_token_ids_into_text(two_replicas):
    view, *_ = two_replicas
    view.set_detokenizer(lambda ids: "".join(chr(65 + t % 26) for t in ids))
    first = view.tree.items()[0]
    assert first.text(2).startswith("MNO")  # 1000 % 26 == 12 -> "M"
    view.tree.setCurrentItem(first)
    assert "text:" in view.detail.toPlainText() and "MNOPQ" in view.detail.toPlainText()


def test_a_restart_redraws_the_tree_and_removing_a_connection_stops_its_monitor(
    two_replicas, qtbot
):
    view, connections, snaps, monitors = two_replicas
    cache_b = snaps[B].cache.copy()
    cache_b.apply(EventBatch(time.time(), [AllBlocksCleared()]), time.time())
    snaps[B] = snapshot(snaps[B].connection, cache_b, status("live", restarts=2))
    view.poll()
    qtbot.waitUntil(lambda: view.tree_settled() and (A, B) not in runs_by_replicas(view))
    assert (A, B) not in runs_by_replicas(view)  # B holds nothing now
    assert "2 restarts (cache cleared)" in view.status_text(B)
    assert view.status_text(B).startswith("live")
    view.cards[B].disconnect_button.click()  # the card's button removes the connection
    assert [c.label for c in connections] == [A]
    monitor_b = next(m for m in monitors if m.connection.label == B)
    assert monitor_b.stopped.wait(5)
    assert set(view.cards) == {A}
    qtbot.waitUntil(view.tree_settled)
    assert set(runs_by_replicas(view)) == {(A,)}


def test_the_routing_box_tokenizes_off_the_gui_thread_and_lights_the_best_replica(
    two_replicas, qtbot
):
    view, *_ = two_replicas
    gui = threading.get_ident()
    threads = []

    def tokenize(connection, model, messages):
        threads.append(threading.get_ident())
        assert model == "tiny"
        assert messages == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello"},
        ]
        return SYSTEM[: 12 * BS] + [1, 2, 3]  # the system prompt's first 12 blocks and more

    view.routing.tokenize = tokenize
    view.routing.system.setText("Be brief.")
    view.routing.prompt.setText("hello")
    view.routing.button.click()
    qtbot.waitUntil(lambda: view.routing.table.rowCount() == 2 and not view.routing.busy())
    assert threads and gui not in threads
    assert view.routing.rows() == [
        [f"★ {A}", "12 / 12", "192 of 195", "token ids"],
        [B, "5 / 12", "80 of 195", "token ids"],
    ]
    assert view.routing.note.text().startswith(f"Best: {A} holds 12")


def test_the_connect_dialog_shows_parse_errors_inline_and_returns_the_connection(qtbot):
    dialog = ConnectDialog()
    qtbot.addWidget(dialog)
    dialog.url.setText("ftp://gpu-a")
    dialog._accept()
    assert dialog.error.isVisibleTo(dialog)
    assert "must start with http:// or https://" in dialog.error.text()
    assert dialog.result() == 0 and dialog.result_connection is None
    dialog.url.setText("gpu-a:8000/v1")
    dialog.kv_events.setText("tcp://gpu-a")
    dialog._accept()
    assert "KV events endpoint needs a host and a port" in dialog.error.text()
    dialog.kv_events.setText("tcp://gpu-a:5557")
    dialog.name.setText("replica 1")
    dialog._accept()
    conn = dialog.result_connection
    assert (conn.url, conn.kv_events, conn.label) == (
        "http://gpu-a:8000",
        "tcp://gpu-a:5557",
        "replica 1",
    )


def test_the_connect_action_lands_in_the_engine_menu_and_adds_the_connection(qtbot, monkeypatch):
    from PySide6.QtWidgets import QDialog, QMainWindow

    window = QMainWindow()
    qtbot.addWidget(window)
    window.menuBar().addMenu("&Engine")
    connections = ConnectionList()
    action = add_connect_action(window, connections)
    menu = window.menuBar().actions()[0].menu()
    assert action in menu.actions() and action.text() == "Connect…"

    def fake_exec(dialog):
        dialog.url.setText("http://127.0.0.1:8011")
        dialog._accept()
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(ConnectDialog, "exec", fake_exec)
    action.trigger()
    assert [c.url for c in connections] == ["http://127.0.0.1:8011"]


def test_status_lines_count_silence_and_the_reconnect_backoff():
    from kvscope.app.desktop.remote_view.status_line import status_line

    conn = parse_connection("http://gpu-a:8000", "tcp://gpu-a:5557")
    now = time.time()
    cache = RemoteCache(A)
    quiet = status("silent", since=now - 30, last_frame_at=now - 42)
    idle = status_line(snapshot(conn, cache, quiet), now)
    assert idle.text == "idle for 42 s · seq 812 · replayed 3 · lost 0 seqs"
    assert idle.severity == "idle"  # connected, nothing running: a quiet server
    busy = RemoteMetrics(scraped_at=now, running=2.0, waiting=0.0)
    silent = status_line(snapshot(conn, cache, quiet, metrics=[busy]), now)
    assert silent.state == "silent for 42 s" and silent.severity == "warn"  # events not coming
    # Reconnected 5 s ago to a server whose last frame is old: quiet since the reconnect.
    back = status("silent", since=now - 1, last_frame_at=now - 200, connected_at=now - 5)
    assert status_line(snapshot(conn, cache, back), now).state == "idle for 5 s"
    lost = status("connecting", error="connection lost", retry_at=now + 4.2, missed=5)
    line = status_line(snapshot(conn, cache, lost), now)
    assert line.state == "reconnecting in 5 s" and line.severity == "warn"  # 4.2 s, rounded up
    assert "events: connection lost" in line.details and "replayed 3 · lost 5 seqs" in line.details
    metrics_only = parse_connection("http://gpu-a:8000")
    line = status_line(snapshot(metrics_only, cache, None, http_state="up"), now)
    assert line.text == "live · no KV events endpoint: metrics only"


def test_real_monitors_on_a_server_that_is_not_there_show_down_without_blocking(qtbot):
    """The default monitors (app/remote/monitor.py) against ports nobody listens on: the view
    says "down" with the HTTP error while the GUI thread keeps turning."""
    connections = ConnectionList()
    view = RemoteView(connections)
    qtbot.addWidget(view)
    view.show()
    events = free_endpoint()
    http = events.rsplit(":", 1)[1]  # nothing listens on that port, for HTTP either
    connections.add(parse_connection(f"http://127.0.0.1:{http}", events))
    label = f"127.0.0.1:{http}"
    ticks = []
    view.timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    qtbot.waitUntil(lambda: view.status_text(label).startswith("down"), timeout=10_000)
    said = f"nothing is listening at http://127.0.0.1:{http}: is the server running?"
    assert said in view.status_text(label)
    assert "ConnectError" in view.cards[label].status.toolTip()
    assert ticks  # the timer kept running while the server was away
    view.shutdown()


@pytest.mark.slow
def test_two_kvscope_servers_a_shared_system_prompt_is_attributed_and_its_hit_predicted(
    default_model, qtbot, tmp_path
):
    """Two `kvscope serve` servers in this process as two replicas, followed by the view's real
    monitors: a system prompt sent to replica 1 shows as replica 1's branch, with its text (from
    the server's /detokenize, then from a local tokenizer), and
    the routing box (tokenizing on both servers over HTTP) predicts replica 1 for a new prompt
    that starts with it."""
    import openai

    servers = []
    connections = ConnectionList()
    view = RemoteView(connections)
    qtbot.addWidget(view)
    try:
        for name in ("replica-1", "replica-2"):
            servers.append(start_server(default_model, 64, 512, BS, kv_events=True))
            pub, replay = servers[-1].kv_endpoints
            connections.add(parse_connection(servers[-1].base_url, pub, replay, name=name))
        view.resize(1024, 700)
        view.show()
        system = "You are a careful assistant who answers in one short sentence. " * 8
        client = openai.OpenAI(base_url=f"{servers[0].base_url}/v1", api_key="-", max_retries=0)
        client.chat.completions.create(
            model=servers[0].model_name,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
            max_tokens=1,
        )

        def replica_1_branch():
            runs = [item.data(0, RUN_ROLE) for item in view.tree.items()]
            return next((r for r in runs if r.replicas == ("replica-1",) and r.blocks >= 7), None)

        qtbot.waitUntil(
            lambda: view.tree_settled() and replica_1_branch() is not None, timeout=30_000
        )
        assert not any("replica-2" in item.data(0, RUN_ROLE).replicas for item in view.tree.items())
        # No local tokenizer: selecting the branch asks replica 1's /detokenize for its text.
        branch = next(i for i in view.tree.items() if i.data(0, RUN_ROLE) == replica_1_branch())
        view.tree.setCurrentItem(branch)
        qtbot.waitUntil(lambda: "careful assistant" in view.detail.toPlainText(), timeout=10_000)
        # The rows' previews are decoded by the server too, in the background.
        qtbot.waitUntil(lambda: "careful assistant" in branch.text(2), timeout=10_000)
        tokenizer = servers[0].driver.call(lambda e: e.tokenizer).result(timeout=60)
        view.set_detokenizer(tokenizer.decode)
        assert "careful assistant" in view.tree.describe(replica_1_branch())
        qtbot.waitUntil(
            lambda: view.status_text("replica-2").startswith(("live", "silent", "idle")),
            timeout=10_000,
        )

        view.routing.system.setText(system)
        view.routing.prompt.setText("What is rain?")
        view.routing.check()
        qtbot.waitUntil(
            lambda: bool(view.routing.rows()) and not view.routing.busy(), timeout=30_000
        )
        best, other = view.routing.hits
        # The system prompt's ~110 tokens fill 6 blocks; the block with the user's turn differs.
        assert best.replica == "replica-1" and 6 <= best.blocks_held < best.blocks_in_prompt
        assert other.replica == "replica-2" and other.blocks_held == 0
        # kvscope serve publishes vLLM's sha256 hashes (its cache_config_info says so), seeded
        # as vLLM seeds them without PYTHONHASHSEED: the view predicts them.
        assert best.method == "hash (sha256)"
        assert view.grab().save(str(tmp_path / "remote_view_two_servers.png"))
    finally:
        view.shutdown()
        for server in servers:
            server.stop()


def test_a_narrow_view_puts_tree_plots_and_routing_in_tabs(two_replicas, qtbot):
    """As narrow as the map column of a 1024 px window: tabs, tiles in two rows of four."""
    view, *_ = two_replicas
    assert not view.narrow and view.pages.currentWidget() is view.body
    view.resize(520, 640)
    qtbot.waitUntil(lambda: view.narrow)
    assert view.pages.currentWidget() is view.tabs
    assert [view.tabs.tabText(i) for i in range(3)] == ["Prefix tree", "Over time", "Routing"]
    assert view.cards[A].columns == 4 and view.minimumSizeHint().width() <= 520
    view.resize(1024, 700)
    qtbot.waitUntil(lambda: not view.narrow)
    assert view.tabs.count() == 0 and view.body.indexOf(view.tree_column) == 0
    assert view.cards[A].columns == 7


def test_metrics_plots_running_and_token_rate_from_scrapes():
    """The "over time" plots read /metrics scrapes: running + waiting as scraped, tokens/s
    between consecutive scrapes, and no point across a counter that went down (a restart)."""
    from kvscope.app.desktop.remote_view.held_plot import rate_series, scrape_series

    now = 1000.0
    scrapes = [
        RemoteMetrics(scraped_at=990.0, running=1.0, waiting=2.0, generation_tokens_total=100.0),
        RemoteMetrics(scraped_at=992.0, running=3.0, waiting=0.0, generation_tokens_total=160.0),
        RemoteMetrics(scraped_at=994.0, running=None, waiting=None, generation_tokens_total=10.0),
        RemoteMetrics(scraped_at=995.0, running=0.0, waiting=0.0, generation_tokens_total=15.0),
    ]
    history = [(m.scraped_at, m) for m in scrapes]
    t, v = scrape_series(history, now, lambda m: m.running)
    assert t.tolist() == [-10.0, -8.0, -5.0] and v.tolist() == [1.0, 3.0, 0.0]
    t, v = rate_series(history, now, lambda m: m.generation_tokens_total)
    assert t.tolist() == [-8.0, -5.0] and v.tolist() == [30.0, 5.0]  # 60 tokens / 2 s; 5 / 1 s


def test_one_replicas_bad_values_stay_on_its_own_card(two_replicas, qtbot):
    """A replica whose snapshot raises, or whose metrics hold values that cannot be numbers,
    does not freeze the tab: the other replica's card goes on updating."""
    from kvscope.app.remote.metrics_scrape import parse_metrics as parse
    from kvscope.app.remote.monitor import model_ids

    view, _connections, snaps, monitors = two_replicas
    bad = parse('vllm:cache_config_info{block_size="inf",engine="0"} 1.0\n')
    assert bad.block_size is None  # not an OverflowError
    assert parse('vllm:cache_config_info{block_size="10000000"} 1.0\n').block_size is None
    assert model_ids({"data": [{"id": {"x": 1}}, {"id": "ok"}, "junk", {"id": "m" * 999}]}) == (
        "ok",
        "m" * 256,
    )
    assert model_ids({"data": "nope"}) == () and model_ids([1, 2]) == ()

    broken = next(m for m in monitors if m.connection.label == B)

    def explode():
        raise OverflowError("cannot convert float infinity to integer")

    broken.snapshot = explode
    snaps[A] = replace(snaps[A], model="tiny-renamed")
    view.poll()  # must not raise
    assert "tiny-renamed" in view.cards[A].status.text()  # A goes on updating
    assert [s.connection.label for s in view.snapshots] == [A, B]  # B's last good view stays
    # A value the card cannot show: that card says so, the other goes on.
    snaps[A] = replace(snaps[A], model=object())
    view.poll()
    assert "cannot show" in view.cards[A].status.text()
