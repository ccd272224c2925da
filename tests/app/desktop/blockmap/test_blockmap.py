"""Block map: colours of hand-built snapshots, hover cards, legend, naive view, a 100k pool."""

from __future__ import annotations

import numpy as np
import pytest
from hand_snapshots import BS, Seq, make_snapshot, small_pool  # noqa: E402

from kvscope.app.core import request_ids
from kvscope.app.desktop.blockmap import colors, raster
from kvscope.app.desktop.blockmap.legend import KEY_ITEMS, key_pixmaps
from kvscope.app.desktop.blockmap.traffic import TrafficCounter, read_memory
from kvscope.engine.kv.snapshot import KVSnapshot, PoolMetrics, SequenceInfo


def pixel(img: np.ndarray, block: int, cols: int, cell_px: int, x: int, y: int) -> int:
    """Packed colour of pixel (x, y) inside a block's cell."""
    row, col = divmod(block, cols)
    return int(colors.pack(img[row * cell_px + y, col * cell_px + x]))


# ---- colours ---------------------------------------------------------------------------------


def test_request_ids_name_their_group_and_conversation():
    request_id = request_ids.conversation_request_id(12, 3)
    assert request_id == "conv-12/r3"
    assert request_ids.group_of(request_id) == request_ids.conversation_group(12) == "conv-12"
    assert request_ids.conversation_of_group("conv-12") == 12
    load = request_ids.load_request_id(3, 7)
    assert load == "load-3/7" and request_ids.group_of(load) == "load-3"
    for group in ("load-3", "conv-", "conv-x", "other"):
        assert request_ids.conversation_of_group(group) is None
    assert request_ids.group_of("no-slash") == "no-slash"


def test_group_colours_are_stable_and_distinct_for_numbered_groups():
    assert request_ids.group_of("conv-12/turn-3") == "conv-12"
    assert colors.group_color("load-3") == colors.group_color("load-3")
    # crc32, not the salted hash(): a fixed value across runs.
    assert colors.group_color_index("conv-1") == colors.group_color_index("conv-1")
    users = {colors.group_color_index(f"load-{i}") for i in range(len(colors.PALETTE))}
    assert len(users) == len(colors.PALETTE)


def test_cell_colours_of_a_known_snapshot():
    snap = small_pool()
    style = raster.cell_style(snap)
    fg = style.color(raster.FG)
    a = colors.group_color("conv-1")
    b = colors.group_color("load-2")
    c = colors.group_color("load-3")
    assert fg[6] == fg[8] == colors.FREE
    assert fg[5] == colors.CACHED
    assert fg[0] == fg[1] == fg[2] == fg[3] == a  # shared blocks belong to their first owner
    assert fg[4] == b
    assert fg[7] != c and style.hatch[7]  # reserved: hatched, paler stripes of C's colour
    assert fg[7] == colors.mix(np.uint32(c), np.uint32(colors.BACKGROUND), raster.RESERVED_STRIPE)
    assert list(style.shared) == [True, True, False, False, False, False, False, False, False]
    assert style.filled[3] == 5 and style.filled[2] == BS


def test_rendered_cells_show_fill_sharing_and_reservation():
    snap = small_pool()
    cols, px = 3, 10  # inner 9 px, gap 1 px, ring drawn
    img = raster.rasterize(snap, cols, px)
    assert img.shape == (3 * px, 3 * px, 4) and img.dtype == np.uint8
    a = colors.group_color("conv-1")
    shade = int(colors.mix(np.uint32(a), np.uint32(colors.BACKGROUND), raster.SHADE))
    # Free and cached: flat; gap column/row in the background colour.
    assert pixel(img, 6, cols, px, 4, 4) == colors.FREE
    assert pixel(img, 5, cols, px, 4, 4) == colors.CACHED
    assert pixel(img, 6, cols, px, px - 1, 4) == colors.BACKGROUND
    # Full unshared block: owner colour everywhere inside.
    assert pixel(img, 2, cols, px, 0, 0) == pixel(img, 2, cols, px, 8, 8) == a
    # Partial block 3 (5 of 16 slots): left 3 of 9 columns filled, the rest a dark shade.
    assert pixel(img, 3, cols, px, 2, 4) == a
    assert pixel(img, 3, cols, px, 3, 4) == shade
    assert pixel(img, 3, cols, px, 8, 4) == shade
    # Shared block 0 (ref 2): a light ring around the owner colour.
    ring = pixel(img, 0, cols, px, 0, 4)
    assert ring == int(colors.mix(np.uint32(a), np.uint32(colors.WHITE), raster.RING_WHITENESS[0]))
    assert pixel(img, 0, cols, px, 4, 4) == a
    # Reserved block 7: stripes over the shade.
    cell = [pixel(img, 7, cols, px, x, 0) for x in range(9)]
    assert len(set(cell)) == 2


def test_selection_dims_everything_else():
    snap = small_pool()
    plain = raster.cell_style(snap).color(raster.FG)
    lit = raster.cell_style(snap, selected={2}).color(raster.FG)
    # B's table (0, 1, 4) keeps its colours, including the blocks it shares with A.
    assert all(lit[b] == plain[b] for b in (0, 1, 4))
    for b in (2, 3, 5, 6, 7):
        dimmed = colors.mix(np.uint32(plain[b]), np.uint32(colors.BACKGROUND), raster.DIM)
        assert lit[b] == dimmed


def test_one_pixel_cells_still_separate_partial_and_shared():
    snap = small_pool()
    img = raster.rasterize(snap, cols=9, cell_px=1)
    px = [int(colors.pack(img[0, b])) for b in range(9)]
    a = colors.group_color("conv-1")
    assert px[2] == a  # full
    assert px[3] != a and px[3] != colors.FREE  # partial: a half tone
    assert px[0] != a  # shared: brighter
    assert px[5] == colors.CACHED and px[6] == colors.FREE


def test_grid_shape_keeps_cells_square_and_rows_short():
    cols, rows = raster.grid_shape(100_000, 1.0)
    assert cols * rows >= 100_000 and abs(cols - rows) <= 16 and cols % 8 == 0
    cols, rows = raster.grid_shape(1000, 2.0)
    assert cols > rows and cols * rows >= 1000
    assert raster.cell_pixels(40, 25, 400, 250) == 10


def test_state_key_swatches_come_from_the_rasterizer(qapp):
    pixmaps = key_pixmaps(14)
    assert set(pixmaps) == {name for name, _ in KEY_ITEMS}
    assert pixmaps["free"].toImage().pixelColor(5, 5).name().upper() == colors.FREE_HEX.upper()
    assert pixmaps["cached"].toImage().pixelColor(5, 5).name().upper() == colors.CACHED_HEX


# ---- widgets ---------------------------------------------------------------------------------


def big_snapshot(n: int = 100_000, seqs: int = 400) -> KVSnapshot:
    """A busy 100k-block pool: tables of many sequences, shared prefixes, cached blocks."""
    rng = np.random.default_rng(0)
    state = rng.choice([0, 1, 2], size=n, p=[0.3, 0.6, 0.1]).astype(np.uint8)
    owner = np.where(state == 1, rng.integers(0, seqs, n), -1).astype(np.int64)
    ref = np.where(state == 1, rng.choice([1, 1, 1, 2, 4], n), 0).astype(np.int32)
    filled = np.where(state == 1, rng.integers(1, BS + 1, n), 0).astype(np.int32)
    infos = tuple(
        SequenceInfo(i, f"load-{i % 40}/{i}", 0, "running", 100, 120, 120, 0, ())
        for i in range(seqs)
    )
    metrics = PoolMetrics(*([0] * 19))
    return KVSnapshot(
        1, 0.0, "paged", BS, n, state, owner, ref, ref, filled, np.zeros(n, np.int32), state == 2,
        infos, metrics,
    )  # fmt: skip


def test_100k_block_pool_draws_an_overview_and_a_lens(qtbot):
    """A busy 100k-block pool is too large for readable cells: the whole pool in bins above,
    the lens's rows at readable cell size below (redraw times: redraw_bench.py)."""
    from kvscope.app.desktop.blockmap.block_map import BlockMapView

    view = BlockMapView()
    qtbot.addWidget(view)
    view.resize(900, 700)
    view.show()
    qtbot.waitExposed(view)
    snap = big_snapshot()
    for i in range(3):
        view.set_snapshot(snap, selected={3} if i % 2 else ())
    assert view.binned and view.cell_px >= 6
    start, stop = view.lens_blocks()
    rows = -(-(stop - start) // view.cols)
    assert view.image.image.shape[:2] == (rows * view.cell_px, view.cols * view.cell_px)
    grid = view.layout_plan.grid
    assert view.overview_image.image.shape[:2] == (grid.rows * 2, grid.cols * 2)


def test_hover_card_and_block_info(qtbot):
    from kvscope.app.desktop.blockmap import BlockMapPanel

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.resize(1200, 800)
    asked = []
    panel.set_block_info_provider(asked.append)
    panel.set_group_labels({"conv-1": "Volcano chat"})
    panel.update_view(small_pool(), None, {}, None)
    hovered = []
    panel.block_hovered.connect(hovered.append)

    view = panel.paged_map
    view._on_mouse_moved(view.view.mapViewToScene(view.block_center(0)))
    assert hovered == [0] and asked == [0]
    text = panel.hover_text()
    assert "Block 0" in text and "conv-1/a" in text and "load-2/0" in text
    assert "Volcano chat" in text and "shared by 2" in text and "16 / 16" in text
    assert "logical block 0" in text and "reading its tokens" in text

    panel.show_block_info(0, {"block_id": 0, "token_ids": [1, 2, 3], "text": "The cat\nsat"})
    text = panel.hover_text()
    assert "3 tokens" in text and "The cat" in text and "⏎" in text

    view._on_mouse_moved(view.view.mapViewToScene(view.block_center(3)))
    assert asked == [0, 3] and "5 / 16" in panel.hover_text()
    view._on_mouse_moved(view.view.mapViewToScene(view.block_center(6)))
    assert asked == [0, 3]  # free blocks hold nothing to read
    assert "free" in panel.hover_text()


def test_clicks_and_legend_select_sequences(qtbot):
    from kvscope.app.desktop.blockmap import BlockMapPanel

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.set_group_labels({"conv-1": "Volcano chat"})
    panel.update_view(small_pool(), None, {}, None)
    groups = panel.legend.groups()
    assert [g for g, _ in groups] == ["conv-1", "load-2", "load-3"]
    assert "Volcano chat" in groups[0][1] and "4 blocks" in groups[0][1]

    selected = []
    panel.sequence_selected.connect(selected.append)
    panel._on_block_clicked(panel.paged_map, 4)  # B's own block
    assert selected == [2] and panel.paged_map.selected == {2}
    panel._on_block_clicked(panel.paged_map, 4)  # again: clears
    assert selected == [2, -1] and panel.paged_map.selected == frozenset()
    panel.legend.group_clicked.emit("conv-1")
    assert selected[-1] == 1 and panel.paged_map.selected == {1}
    assert panel.legend.selectedItems()[0].data(0x0100) == "conv-1"


def shadow_pool() -> KVSnapshot:
    """Contiguous reservations with holes: A holds 0-5 (2 written), B 8-11 (1 written)."""
    seqs = [
        Seq(1, "conv-1/a", (0, 1), 2 * BS - 3, reserved=(0, 1, 2, 3, 4, 5)),
        Seq(2, "load-2/0", (8,), 7, reserved=(8, 9, 10, 11)),
    ]
    return make_snapshot(16, seqs, allocator="contiguous-shadow", waiting=3)


def test_shadow_view_caption_and_metrics(qtbot):
    from kvscope.app.desktop.blockmap import BlockMapPanel

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    shadow = shadow_pool()
    assert shadow.metrics.largest_free_run == 4 and shadow.metrics.num_free_runs == 2
    stats = {"num_running": 2, "num_waiting": 0, "prefix_cache_hit_tokens": 32}
    stats["prefix_cache_query_tokens"] = 128
    panel.update_view(small_pool(), shadow, stats, None)
    caption = panel.shadow_frame.caption.text()
    assert "7 reserved empty" in caption and "3 waiting" in caption
    # Free 6-7 lie between A and B: a hole; 12-15 are the pool's free tail, not one.
    assert "largest free run 4 of 6 free" in caption and "(1 hole)" in caption
    strip = panel.strip.text()
    assert "PREFIX HITS: 25%" in strip and "naive: 3 waiting" in strip
    assert "no NVIDIA GPU" in strip
    # The shadow's hover card says it holds no K/V, and asks the provider nothing.
    asked = []
    panel.set_block_info_provider(asked.append)
    view = panel.shadow_map
    view._on_mouse_moved(view.view.mapViewToScene(view.block_center(3)))
    assert "reserved" in panel.hover_text() and "no K/V" in panel.hover_text() and not asked


def test_metrics_tolerate_missing_device_memory_keys():
    assert read_memory(None).detail == "CPU · no NVIDIA GPU"
    gpu = {"gpus": [{"name": "NVIDIA H200", "total_bytes": 140 << 30, "used_bytes": 20 << 30}]}
    memory = read_memory(gpu)
    assert memory.headline == "20.0 / 140 GiB" and "H200" in memory.detail
    memory = read_memory({"process_rss_bytes": 3 << 29, "nvml_error": "driver not loaded"})
    assert memory.headline == "RSS 1.50 GiB" and "driver not loaded" in memory.tooltip
    assert memory.process_gib == 1.5


def test_metrics_read_the_real_device_memory_reading():
    from kvscope.engine.memory.device_memory import read_device_memory

    memory = read_memory(read_device_memory().to_dict())
    assert memory.headline.startswith("RSS ") and memory.process_gib > 0.01


def test_tokens_per_second_from_snapshot_deltas():
    counter = TrafficCounter(rate_window_s=2.0)
    snap = make_snapshot(8, [Seq(1, "conv-1/a", (0, 1), 20, num_prompt_tokens=18)])
    counter.update(0.0, snap, {})
    snap = make_snapshot(8, [Seq(1, "conv-1/a", (0, 1), 30, num_prompt_tokens=18)])
    counter.update(1.0, snap, {})
    assert counter.generated_tokens == 12
    assert counter.tokens_per_s == pytest.approx(10.0)
    counter.update(1.5, snap, {})  # same snapshot again: no new tokens
    assert counter.generated_tokens == 12


def test_time_plots_keep_a_two_minute_window(qtbot):
    from kvscope.app.desktop.blockmap.time_plots import WINDOW_S, TimePlots

    plots = TimePlots()
    qtbot.addWidget(plots)
    for i in range(300):  # 150 s at 2 Hz
        plots.add_sample(i * 0.5, {"paged_held": i, "naive_held": None})
    x, y = plots.series("paged_held")
    assert x[0] >= -WINDOW_S and x[-1] == 0 and y[-1] == 299
    assert np.isnan(plots.series("naive_held")[1]).all()  # missing values are gaps
    assert len(plots.curves["paged_held"].getData()[0]) == len(x)


def test_empty_pool_and_unlisted_owner_still_draw():
    empty = make_snapshot(5, [])
    img = raster.rasterize(empty, cols=3, cell_px=4)  # 2 rows, the last one part empty
    assert pixel(img, 0, 3, 4, 1, 1) == colors.FREE
    assert int(colors.pack(img[5, 9])) == colors.BACKGROUND  # past the last block
    snap = small_pool()
    orphan = KVSnapshot(**{**snap.__dict__, "sequences": snap.sequences[1:]})
    fg = raster.cell_style(orphan).color(raster.FG)
    assert fg[2] == colors.UNKNOWN and fg[4] == colors.group_color("load-2")
