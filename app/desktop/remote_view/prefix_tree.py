"""PrefixTreeView: the merged prefix tree of every replica's cached blocks (merged_tree.py).

One row per run of blocks: a bar in the colours of the replicas holding it ("100 blocks"),
its length growing with the log of the block count so a 2-block branch stays visible beside a
1000-block prompt; then the text the run holds (detokenized when a detokenizer is set, token
ids otherwise). Hovering a row shows the run in a tooltip, selecting it shows it whole in the
detail box under the tree. Rebuilt only when a cache changed; expansion and selection are
kept by the runs' content paths. Its sheet, bars and text follow the theme (`follow_theme`): a
replica's hue is drawn as the theme on show draws it (blockmap/colors.py `themed_hex`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from PySide6.QtCore import QEvent, QModelIndex, QPersistentModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QHelpEvent, QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolTip,
    QTreeWidget,
    QTreeWidgetItem,
)

from kvscope.app.desktop.blockmap.colors import themed_hex
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.remote_view.merged_tree import TreeRun
from kvscope.app.desktop.theme import follow_theme

Detokenizer = Callable[[list[int]], str]
RUN_ROLE = Qt.ItemDataRole.UserRole + 1
BAR_MIN_PX, BAR_MAX_PX = 34, 150
PREVIEW_CHARS = 140
PREVIEW_TOKENS = 64
MAX_ROWS = 2000  # past this the tree says how many runs it left out; a router's cache is big
EXPAND_BELOW = 400  # expand everything when the tree has fewer runs than this


def tree_style(p: Palette) -> str:
    """The tree's own sheet (the remote view's would paint it the ground's colour)."""
    return (
        f"QTreeWidget {{ background: {p.well}; border: 1px solid {p.border}; color: {p.text};"
        " font-size: 11px; }"
        " QTreeWidget::item { padding: 1px 0; }"
        f" QTreeWidget::item:selected {{ background: {p.selected}; color: {p.strong}; }}"
        f" QTreeWidget::item:hover {{ background: {p.hover}; }}"
        f" QHeaderView::section {{ background: {p.surface}; color: {p.muted}; border: none;"
        f" border-bottom: 1px solid {p.border}; padding: 2px 6px; font-size: 10px;"
        " font-weight: bold; }"
    )


def token_text(tokens: tuple[int, ...], detokenize: Detokenizer | None) -> str:
    """The run's text, or its token ids when there is no detokenizer (or it fails)."""
    if not tokens:
        return "(no token ids in the events)"
    if detokenize is not None:
        try:
            return detokenize(list(tokens))
        except Exception as e:  # a detokenizer for another model: show ids, say why
            return f"[cannot decode: {e}] " + " ".join(map(str, tokens))
    return " ".join(map(str, tokens))


def _one_line(text: str, limit: int = PREVIEW_CHARS) -> str:
    flat = text.replace("\n", "⏎").replace("\t", "→")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _child_items(item: QTreeWidgetItem) -> list[QTreeWidgetItem]:
    # child(i) is None only past childCount(); the filter is for the type checker.
    return [c for i in range(item.childCount()) if (c := item.child(i)) is not None]


def _top_items(tree: QTreeWidget) -> list[QTreeWidgetItem]:
    # As _child_items: topLevelItem(i) is None only past topLevelItemCount().
    count = tree.topLevelItemCount()
    return [t for i in range(count) if (t := tree.topLevelItem(i)) is not None]


def bar_width(blocks: int, most: int) -> int:
    if most <= 1:
        return BAR_MIN_PX
    share = math.log1p(blocks) / math.log1p(most)
    return int(BAR_MIN_PX + share * (BAR_MAX_PX - BAR_MIN_PX))


class _BarDelegate(QStyledItemDelegate):
    """Column 0: the run's bar, one horizontal stripe per replica holding it, with its count."""

    def __init__(self, view: PrefixTreeView) -> None:
        super().__init__(view)
        self.view = view

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        run: TreeRun | None = index.data(RUN_ROLE)
        if run is None:
            super().paint(painter, option, index)
            return
        style = option.widget.style() if option.widget else None
        if style is not None:  # selection / hover background
            opt = QStyleOptionViewItem(option)
            self.initStyleOption(opt, index)
            opt.text = ""
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, option.widget)
        rect = option.rect.adjusted(2, 3, -2, -3)
        width = min(rect.width(), bar_width(run.blocks, self.view.most_blocks))
        bar = QRect(rect.left(), rect.top(), width, rect.height())
        painter.save()
        stripes = run.replicas or ("?",)
        for i, replica in enumerate(stripes):
            top = bar.top() + i * bar.height() // len(stripes)
            bottom = bar.top() + (i + 1) * bar.height() // len(stripes)
            color = QColor(themed_hex(self.view.color_of(replica)))
            if run.orphan:
                color.setAlpha(130)  # its start is unknown: drawn fainter
            painter.fillRect(QRect(bar.left(), top, bar.width(), bottom - top), color)
        painter.setPen(QColor(current().on_bar))
        label = f"{run.blocks:,} block" + ("" if run.blocks == 1 else "s")
        painter.drawText(bar.adjusted(4, 0, 0, 0), Qt.AlignmentFlag.AlignVCenter, label)
        painter.restore()

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        size = super().sizeHint(option, index)
        return QSize(max(size.width(), BAR_MAX_PX + 4), max(size.height(), 18))


class PrefixTreeView(QTreeWidget):
    run_selected = Signal(object)  # TreeRun, or None when cleared

    def __init__(self, color_of: Callable[[str], str], parent=None) -> None:
        super().__init__(parent)
        self.color_of = color_of
        self.most_blocks = 1
        self.detokenize: Detokenizer | None = None
        # Row previews the server decoded (preview tokens -> text), filled by the view.
        self.previews: dict[tuple[int, ...], str] = {}
        self.roots: list[TreeRun] = []
        self.rows_left_out = 0
        self._known: set[tuple] = set()  # run keys shown last time (new ones may auto-expand)
        self.setColumnCount(3)
        self.setHeaderLabels(["BLOCKS", "HELD BY", "TOKENS"])
        self.setItemDelegateForColumn(0, _BarDelegate(self))
        self.setUniformRowHeights(True)
        self.setIndentation(12)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setMouseTracking(True)
        header = self.header()
        header.setStretchLastSection(True)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(0, BAR_MAX_PX + 60)
        header.resizeSection(1, 110)
        self.currentItemChanged.connect(self._on_current)
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        """The theme's sheet; the rows' replica colours drawn again in the theme's hues."""
        self.setStyleSheet(tree_style(palette))
        for item in self.items():
            run = item.data(0, RUN_ROLE)
            if run.replicas:
                item.setForeground(1, QColor(themed_hex(self.color_of(run.replicas[0]))))
        self.viewport().update()

    def set_detokenizer(self, fn: Detokenizer | None) -> None:
        self.detokenize = fn
        self.set_roots(self.roots)

    def set_roots(self, roots: list[TreeRun]) -> None:
        expanded, selected = self._view_state()
        first_fill = not self.roots
        self.roots = roots
        self.setUpdatesEnabled(False)
        self.clear()
        self.most_blocks = max((r.blocks for r in self._walk()), default=1)
        items: dict[tuple, QTreeWidgetItem] = {}
        rows = 0
        stack: list[tuple[QTreeWidgetItem | None, TreeRun]]
        stack = [(None, r) for r in reversed(roots)]
        left_out = 0
        while stack:
            parent, run = stack.pop()
            if rows >= MAX_ROWS:
                left_out += 1
                stack.extend((None, c) for c in run.children)
                continue
            item = self._item(run)
            if parent is None:
                self.addTopLevelItem(item)
            else:
                parent.addChild(item)
            items[run.key] = item
            rows += 1
            stack.extend((item, c) for c in reversed(run.children))
        self.rows_left_out = left_out
        expand_new = rows < EXPAND_BELOW  # a big tree opens at its roots only
        for key, item in items.items():
            new = first_fill or key not in self._known
            if key in expanded or (new and (expand_new or item.parent() is None)):
                item.setExpanded(True)
        self._known = set(items)
        if selected in items:
            self.setCurrentItem(items[selected])
        self.setUpdatesEnabled(True)

    def preview_tokens(self, run: TreeRun) -> tuple[int, ...]:
        """The tokens a row's preview shows: one line's worth, from the run's start."""
        return run.token_ids[:PREVIEW_TOKENS]

    def visible_runs(self) -> list[TreeRun]:
        """The runs with a row, in row order."""
        runs: list[TreeRun] = []
        stack = _top_items(self)[::-1]
        while stack:
            item = stack.pop()
            runs.append(item.data(0, RUN_ROLE))
            stack.extend(reversed(_child_items(item)))
        return runs

    def show_previews(self, texts: dict[tuple[int, ...], str]) -> None:
        """Replace rows' token ids with text decoded elsewhere (the server's /detokenize),
        keyed by `preview_tokens(run)`."""
        self.previews.update(texts)
        stack = _top_items(self)
        while stack:
            item = stack.pop()
            text = texts.get(self.preview_tokens(item.data(0, RUN_ROLE)))
            if text is not None:
                item.setText(2, _one_line(text))
            stack.extend(_child_items(item))

    def _item(self, run: TreeRun) -> QTreeWidgetItem:
        # The preview decodes only the run's first tokens: a row shows one line of them.
        tokens = self.preview_tokens(run)
        text = self.previews.get(tokens) if self.detokenize is None else None
        if text is None:
            text = token_text(tokens, self.detokenize)
        item = QTreeWidgetItem(["", ", ".join(run.replicas), _one_line(text)])
        item.setData(0, RUN_ROLE, run)
        if run.replicas:
            item.setForeground(1, QColor(themed_hex(self.color_of(run.replicas[0]))))
        return item

    def describe(self, run: TreeRun, max_chars: int = 600, text: str | None = None) -> str:
        """Rich text about a run: where it starts, who holds it, what it holds (`text`: the
        run decoded elsewhere, by the server's /detokenize)."""
        decoded = text is not None or self.detokenize is not None
        if text is None:
            text = token_text(run.token_ids, self.detokenize)
        if len(text) > max_chars:
            text = text[: max_chars - 1] + "…"
        who = ", ".join(
            f"<span style='color:{themed_hex(self.color_of(r))}'>■</span> {escape(r)}"
            for r in run.replicas
        )
        start = (
            "parent not held (stored before we listened, or evicted)"
            if run.orphan
            else f"blocks {run.depth_blocks + 1:,}–{run.depth_blocks + run.blocks:,} of its prompt"
        )
        below = run.subtree_blocks - run.blocks
        more = f"; {below:,} more blocks in branches below" if below else ""
        kind = "text" if decoded else "token ids"
        return (
            f"<b>{run.blocks:,} blocks</b> ({len(run.token_ids):,} tokens), {start}{more}<br>"
            f"held by {who or 'no one'}<br><span style='color:{current().muted}'>{kind}:</span> "
            f"{escape(text).replace(chr(10), '⏎')}"
        )

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        """Tooltips written when asked for: describing every row up front cost more than
        building the tree."""
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            item = self.itemAt(event.pos())
            if item is not None:
                QToolTip.showText(event.globalPos(), self.describe(item.data(0, RUN_ROLE)), self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def _walk(self):
        stack = list(self.roots)
        while stack:
            run = stack.pop()
            yield run
            stack.extend(run.children)

    def _view_state(self) -> tuple[set[tuple], tuple | None]:
        expanded: set[tuple] = set()
        stack = _top_items(self)
        while stack:
            item = stack.pop()
            if item.isExpanded():
                expanded.add(item.data(0, RUN_ROLE).key)
            stack.extend(_child_items(item))
        current = self.currentItem()
        return expanded, current.data(0, RUN_ROLE).key if current is not None else None

    def _on_current(self, current: QTreeWidgetItem | None, _previous) -> None:
        self.run_selected.emit(current.data(0, RUN_ROLE) if current is not None else None)

    def items(self) -> list[QTreeWidgetItem]:
        """Every row, in pre-order (for tests)."""
        out: list[QTreeWidgetItem] = []
        stack = _top_items(self)[::-1]
        while stack:
            item = stack.pop()
            out.append(item)
            stack.extend(reversed(_child_items(item)))
        return out
