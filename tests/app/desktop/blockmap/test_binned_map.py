"""The block map at real pool sizes: bins that never lose a block, the overview over the lens,
the lens following the active region or the selection, hover and click on both."""

from __future__ import annotations

import numpy as np
import pytest
from hand_snapshots import BS, Seq, make_snapshot

from kvscope.app.desktop.blockmap import bins, colors, lens, overview, raster
from kvscope.app.desktop.blockmap.map_geometry import plan
from kvscope.app.desktop.blockmap.sample_pools import naive_shadow, realistic_pool
from kvscope.engine.kv.snapshot import BlockState

VIEW = (689, 345)  # one map's area at a 1400 x 860 window


def overview_image(snapshot, width=VIEW[0], height=VIEW[1], selected=()):
    grid = plan(snapshot.num_blocks, width, height).grid
    assert grid is not None
    palette = raster.owner_colors(snapshot)
    chosen = raster.selection_mask(snapshot, selected) if selected else None
    counts = bins.count_bins(snapshot, grid, palette, chosen)
    shades = overview.bin_colors(counts, grid, palette, None, chosen is not None)
    return grid, overview.compose(shades, grid, colors.BACKGROUND)


def bin_pixel(image: np.ndarray, grid: bins.BinGrid, index: int) -> int:
    row, col = divmod(index, grid.cols)
    return int(colors.pack(image[row * grid.bin_px, col * grid.bin_px]))


def test_one_cached_block_among_200k_shows_in_the_overview():
    snap = make_snapshot(200_000, [], cached=(123_456,))
    grid, image = overview_image(snap)
    assert grid.blocks_per_bin > 1  # many blocks per pixel, yet:
    lit = bin_pixel(image, grid, grid.bin_of(123_456))
    assert lit != colors.FREE and lit != colors.BACKGROUND
    assert bin_pixel(image, grid, grid.bin_of(123_456) + 1) == colors.FREE
    assert bin_pixel(image, grid, 0) == colors.FREE


def test_every_bin_holding_something_differs_from_free_ones():
    rng = np.random.default_rng(3)
    blocks = rng.choice(200_000, size=300, replace=False)
    seqs = [Seq(1, "conv-1/r0", tuple(int(b) for b in blocks[:150]), 150 * BS)]
    snap = make_snapshot(200_000, seqs, cached=tuple(int(b) for b in blocks[150:]))
    grid, image = overview_image(snap)
    shades = image[:: grid.bin_px, :: grid.bin_px].copy().view("<u4")[..., 0].ravel()
    shades = shades[: grid.num_bins]
    holding = np.zeros(grid.num_bins, dtype=bool)
    holding[np.unique(blocks // grid.blocks_per_bin)] = True
    assert (shades[holding] != colors.FREE).all()
    assert (shades[~holding] == colors.FREE).all()
    # Held blocks take their sequence's hue, cached ones the cached grey's.
    held_bin = grid.bin_of(int(blocks[0]))
    cached_bin = grid.bin_of(int(blocks[200]))
    conv1 = colors.unpack(np.uint32(colors.group_color("conv-1"))).astype(int)
    free = colors.unpack(np.uint32(colors.FREE)).astype(int)
    held_rgb = colors.unpack(np.uint32(shades[held_bin])).astype(int)
    assert np.dot(held_rgb[:3] - free[:3], conv1[:3] - free[:3]) > 0
    assert shades[held_bin] != shades[cached_bin]


def test_a_bin_takes_its_dominant_sequence_and_its_share_as_intensity():
    # 8 blocks per bin: bin 0 mostly conv-1, bin 1 half-full of conv-1, bin 2 split 4 ways.
    seqs = [
        Seq(1, "conv-1/r0", (0, 1, 2, 3, 4, 5, 8, 9, 10, 11), 10 * BS),
        Seq(2, "load-2/0", (6, 16, 17), 3 * BS),
        Seq(3, "load-3/0", (18, 19), 2 * BS),
        Seq(4, "load-4/0", (20, 21), 2 * BS),
        Seq(5, "load-5/0", (22, 23), 2 * BS),
    ]
    snap = make_snapshot(24, seqs)
    grid = bins.BinGrid(24, 8, 3, 1)
    palette = raster.owner_colors(snap)
    counts = bins.count_bins(snap, grid, palette, None)
    assert list(counts.used) == [7, 4, 8]
    row_of = {int(i): r for r, i in enumerate(palette.ids)}
    assert counts.dominant[0] == row_of[1] and counts.dominant_count[0] == 6
    shades = overview.bin_colors(counts, grid, palette)
    a = colors.group_color("conv-1")
    brighter, dimmer = (colors.unpack(np.uint32(shades[i])).astype(int) for i in (0, 1))
    full = colors.unpack(np.uint32(a)).astype(int)
    # Same hue, the fuller bin nearer the sequence's own colour.
    assert np.abs(brighter - full).sum() < np.abs(dimmer - full).sum()
    # No sequence holds half of bin 2: a neutral colour, none of theirs.
    assert shades[2] not in {colors.group_color(f"load-{i}") for i in range(2, 6)}


def test_the_majority_owner_matches_a_count_by_hand():
    rng = np.random.default_rng(0)
    n = 20_011
    # Owners in runs of random length, as tables are: bins with one, two or several owners.
    rows = np.repeat(rng.integers(0, 6, n), rng.integers(1, 9, n))[:n].astype(np.int32)
    rows[rng.random(n) < 0.3] = -1
    grid = bins.BinGrid(n, 13, 100, 1)
    held = np.concatenate([rows >= 0, np.zeros(grid.num_bins * 13 - n, bool)])
    majority, count = bins._majority(rows, grid, held.reshape(-1, 13).sum(axis=1))
    for index in range(grid.num_bins):
        start, stop = grid.block_range(index)
        held = rows[start:stop][rows[start:stop] >= 0]
        values, counts = np.unique(held, return_counts=True)
        if not len(held) or 2 * counts.max() < len(held):
            assert majority[index] == -1 and count[index] == 0
            continue
        assert count[index] == counts.max()
        assert counts[values == majority[index]][0] == counts.max()


def test_small_pools_keep_one_cell_per_block():
    for blocks in (64, 1_456):
        geometry = plan(blocks, *VIEW)
        assert not geometry.binned and geometry.cell_px >= 6
        assert geometry.cols * geometry.rows >= blocks
    big = plan(10_922, *VIEW)
    assert big.binned and big.grid is not None and big.grid.blocks_per_bin == 1
    assert big.cell_px == lens.LENS_CELL_PX


def test_the_lens_stays_unless_another_region_is_much_busier():
    weights = np.zeros(1000)
    weights[500:520] = 1  # rows 50 and 51
    assert lens.busiest_row(weights, 10, 5) in range(47, 51)  # a 5-row window over them
    weights[100:122] = 1  # a little busier: where the lens already is wins
    assert lens.busiest_row(weights, 10, 5, current=50) == 50
    weights[100:200] = 1  # far busier: it moves
    assert lens.busiest_row(weights, 10, 5, current=50) in range(10, 16)


@pytest.fixture
def big_view(qtbot):
    from kvscope.app.desktop.blockmap.block_map import BlockMapView

    view = BlockMapView()
    qtbot.addWidget(view)
    view.resize(*VIEW)
    view.show()
    qtbot.waitExposed(view)
    return view


def test_the_widget_overview_shows_a_lone_cached_block(big_view):
    big_view.set_snapshot(make_snapshot(200_000, [], cached=(123_456,)))
    assert big_view.binned
    grid = big_view.layout_plan.grid
    lit = bin_pixel(big_view.overview_image.image, grid, grid.bin_of(123_456))
    assert lit not in (colors.FREE, colors.BACKGROUND)


def test_the_lens_follows_the_busiest_region_then_the_selected_sequence(big_view):
    busy = Seq(1, "conv-1/r0", tuple(range(40_000, 40_300)), 300 * BS)
    lone = Seq(2, "conv-2/r0", (150_001, 150_002, 150_003), 3 * BS)
    snap = make_snapshot(200_000, [busy, lone])
    big_view.set_snapshot(snap)
    start, stop = big_view.lens_blocks()
    assert start <= 40_000 and 40_299 < stop
    big_view.set_selected({2})
    start, stop = big_view.lens_blocks()
    assert start <= 150_001 and 150_003 < stop
    # The lens's cells are the blocks: the pointer over one names it.
    scene = big_view.view.mapViewToScene(big_view.block_center(150_002))
    hovered = []
    big_view.block_hovered.connect(hovered.append)
    big_view._on_mouse_moved(scene)
    assert hovered == [150_002]


def test_hovering_a_bin_names_its_range_and_a_click_moves_the_lens(big_view):
    seqs = [Seq(1, "conv-1/r0", (123_450, 123_451), 2 * BS)]
    snap = make_snapshot(200_000, seqs, cached=(123_456,))
    big_view.labels = {"conv-1": "Volcano chat"}
    big_view.set_snapshot(snap)
    grid = big_view.layout_plan.grid
    index = grid.bin_of(123_456)
    first, last = grid.block_range(index)
    big_view._on_mouse_moved(big_view.overview.mapViewToScene(big_view.bin_center(index)))
    card = big_view.hover_label.text()
    assert f"Blocks {first:,}–{last - 1:,}" in card and "1 cached" in card
    if first <= 123_450:
        assert "conv-1/r0 — Volcano chat" in card
    big_view.move_lens_to(5_000)  # what a click on the overview does
    start, stop = big_view.lens_blocks()
    assert start <= 5_000 < stop and not big_view.follow
    big_view.set_snapshot(snap)  # a new snapshot keeps a pinned lens where it is
    assert big_view.lens_blocks() == (start, stop)
    big_view.resume_follow()  # a double-click
    start, stop = big_view.lens_blocks()
    assert start <= 123_450 < stop


def test_the_naive_side_bins_its_reservations_too(qtbot):
    from kvscope.app.desktop.blockmap import BlockMapPanel

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.resize(1400, 860)
    paged = realistic_pool(200_000)
    shadow = naive_shadow(paged)
    panel.update_view(paged, shadow, {}, None)
    view = panel.shadow_map
    assert view.binned and panel.paged_map.binned
    grid = view.layout_plan.grid
    reserved = np.flatnonzero(shadow.state == BlockState.RESERVED)
    lit = bin_pixel(view.overview_image.image, grid, grid.bin_of(int(reserved[-1])))
    assert lit not in (colors.FREE, colors.BACKGROUND)


def test_the_lens_outline_covers_exactly_the_lens_bins():
    from kvscope.app.desktop.blockmap.lens_marker import lens_rects

    grid = bins.BinGrid(10_000, 10, 20, 2)  # 20 bins of 10 blocks per row
    (one,) = lens_rects(grid, 50, 120)  # bins 5 to 11 of row 0
    assert (one.x(), one.y(), one.width(), one.height()) == (5, 0, 7, 1)
    tail, middle, head = lens_rects(grid, 150, 655)  # bins 15 (row 0) to 65 (row 3)
    assert (tail.x(), tail.width(), tail.y()) == (15, 5, 0)
    assert (middle.y(), middle.height(), middle.width()) == (1, 2, 20)
    assert (head.x(), head.width(), head.y()) == (0, 6, 3)
    assert lens_rects(grid, 7, 7) == []


def test_the_lens_caption_says_less_rather_than_run_off_a_narrow_map(big_view, qtbot):
    from PySide6.QtGui import QFontMetrics

    snap = make_snapshot(200_000, [Seq(1, "conv-1/r0", tuple(range(100)), 100 * BS)])
    big_view.set_snapshot(snap)
    caption = big_view.lens_caption.text
    assert "busiest region" in caption and "overview" in caption
    big_view.resize(250, VIEW[1])  # a map half at 1024 px with the chat column wide
    qtbot.waitUntil(lambda: big_view.width() == 250)
    label = big_view.lens_caption.item  # the QGraphicsTextItem pyqtgraph draws
    shown = QFontMetrics(label.font()).horizontalAdvance(label.toPlainText())
    assert shown <= big_view.width(), (label.toPlainText(), shown)
    assert label.toPlainText().startswith("Lens: blocks 0–")  # what it shows stays said
