"""Chat text is untrusted: rendering it opens no file and no URL, raw HTML stays text, and a
link click never navigates the bubble nor reaches the OS without the user's yes (http(s) only)."""

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QImage, QTextDocument
from PySide6.QtWidgets import QMessageBox

import kvscope.app.desktop.chat.markdown_view as markdown_view
from kvscope.app.desktop.chat.markdown_view import MarkdownView


@pytest.fixture()
def view(qtbot):
    v = MarkdownView()
    v.resize(500, 300)
    qtbot.addWidget(v)
    v.show()
    return v


def _images(document: QTextDocument) -> list[str]:
    names, block = [], document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isImageFormat():
                names.append(fmt.toImageFormat().name())
            it += 1
        block = block.next()
    return names


def test_markdown_images_are_never_loaded(view, tmp_path):
    png = tmp_path / "secret.png"
    QImage(8, 8, QImage.Format_RGB32).save(str(png))
    # A real image: had anything loaded it, the document's resource cache would hold it. (No
    # /dev/zero or FIFO here: a regression must fail this test, not exhaust the machine.)
    text = f"![a secret]({png}) ![uri]({png.as_uri()}) ![web](https://example.com/x.png)"
    view.set_markdown(text)
    view.grab()  # lay out and paint, where an image would be fetched
    document = view.document()
    assert _images(document) == []
    shown = document.toPlainText()
    assert "[image: a secret]" in shown and "[image: web]" in shown
    for url in (png.as_uri(), str(png)):
        # resource() asks loadResource on a cache miss: QTextDocument's own reads local files.
        assert document.resource(QTextDocument.ImageResource, QUrl(url)) is None
    assert view.loadResource(QTextDocument.ImageResource, QUrl(png.as_uri())) is None


def test_raw_html_is_shown_as_text(view):
    view.set_markdown('hi <font color="red">red</font> <img src="/etc/passwd"> <table><tr>')
    shown = view.document().toPlainText()
    assert '<font color="red">red</font>' in shown and '<img src="/etc/passwd">' in shown
    assert _images(view.document()) == []


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "/etc/passwd", "smb://host/share", "javascript:alert(1)", "x:y"]
)
def test_non_web_links_are_refused(view, monkeypatch, url):
    opened, told = [], []
    monkeypatch.setattr(markdown_view.QDesktopServices, "openUrl", lambda u: opened.append(u))
    monkeypatch.setattr(markdown_view.QMessageBox, "information", lambda *a: told.append(a))
    view.set_markdown(f"[click]({url})")
    before = view.document().toPlainText()
    view.anchorClicked.emit(QUrl(url))
    assert opened == [] and len(told) == 1
    assert view.document().toPlainText() == before  # the bubble was not replaced by the file


@pytest.mark.parametrize("answer", [QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No])
def test_web_links_open_only_after_a_yes(view, monkeypatch, answer):
    opened, asked = [], []
    monkeypatch.setattr(
        markdown_view.QDesktopServices, "openUrl", lambda u: opened.append(u) or True
    )
    monkeypatch.setattr(markdown_view.QMessageBox, "question", lambda *a: asked.append(a) or answer)
    view.set_markdown("[docs](https://example.com/docs)")
    view.anchorClicked.emit(QUrl("https://example.com/docs"))
    assert len(asked) == 1
    assert opened == ([QUrl("https://example.com/docs")] if answer == QMessageBox.Yes else [])
