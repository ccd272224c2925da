"""The colours that code sets, per theme: the panels' own style sheets, plot grounds, code.

The application's style sheet (assets/style*.qss) colours ordinary widgets; what it cannot
reach is set in code: pyqtgraph's grounds and axes, rich-text spans, the block map's pixels,
code highlighting baked into a message's document, and the panels' own sheets (a widget's own
sheet wins over the application's). Those read `current()` here, which the ThemeKeeper sets
before it tells them (`follow_theme`) to draw again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Palette:
    name: str  # "dark" or "light"
    ground: str  # the panels' background
    surface: str  # tiles, chips, text boxes on the ground
    border: str
    text: str  # body text
    strong: str  # headline values
    muted: str  # captions
    faint: str  # asides in captions
    detail: str  # second lines of tiles
    handle: str  # splitter handles
    scroll: str  # scroll bar groove
    scroll_handle: str
    axis: str  # plot axis lines
    axis_text: str
    hover: str
    selected: str
    selected_border: str
    button: str
    button_border: str
    button_text: str
    button_hover: str
    disabled: str
    accent: str  # focus ring
    link: str  # links in chat messages (Qt's palette role: style sheets cannot set it)
    banner: tuple[str, str, str]  # background, text, border of a warning banner
    tooltip: tuple[str, str, str]  # background, text, border
    code_background: str
    code_header: str
    code_header_text: str
    inline_code: str
    well: str  # lists and tables on the ground (the prefix tree, the routing table)
    best_row: str  # the routing table's best replica
    on_bar: str  # a count written on a replica's coloured bar
    card: tuple[str, str, str]  # the block map's hover card: background (css), text, border
    card_aside: str  # the card's asides (pool, seq, ref count)
    card_emphasis: str  # the card's "shared by" line and token text
    error: str  # error text on the ground
    code_kinds: dict[str, str] = field(default_factory=dict)  # highlight kind -> colour


DARK = Palette(
    name="dark",
    ground="#101216",
    surface="#1D2027",
    border="#2C313B",
    text="#C9CED6",
    strong="#E8EAED",
    muted="#8C94A3",
    faint="#7A8290",
    detail="#A9B0BD",
    handle="#22262E",
    scroll="#1A1D23",
    scroll_handle="#3A404C",
    axis="#3A404C",
    axis_text="#8C94A3",
    hover="#262A33",
    selected="#2A2F39",
    selected_border="#E8EAED",
    button="#232A35",
    button_border="#2F3744",
    button_text="#D7DCE4",
    button_hover="#2B3441",
    disabled="#5D6675",
    accent="#4F8CFF",
    link="#58A6FF",
    banner=("#3A2E12", "#F2D49B", "#7A5A1E"),
    tooltip=("#222833", "#E6E9EE", "#3A4352"),
    code_background="#0D1117",
    code_header="#262C36",
    code_header_text="#8B949E",
    inline_code="#2A3140",
    well="#15171C",
    best_row="#23402F",
    on_bar="#101216",  # the dark map's hues are light
    card=("rgba(16, 18, 23, 238)", "#E8EAED", "#4A5060"),
    card_aside="#9AA3B2",
    card_emphasis="#F0E6C8",
    error="#E8354F",
    # GitHub's dark palette, readable on code_background.
    code_kinds={
        "keyword": "#FF7B72",
        "builtin": "#D2A8FF",
        "constant": "#79C0FF",
        "number": "#79C0FF",
        "string": "#A5D6FF",
        "key": "#7EE787",
        "comment": "#8B949E",
        "meta": "#FFA657",
    },
)

LIGHT = Palette(
    name="light",
    ground="#F6F7F9",
    surface="#FFFFFF",
    border="#D5D9E0",
    text="#2B3140",
    strong="#111827",
    muted="#5A6272",
    faint="#6B7382",
    detail="#4B5363",
    handle="#D5D9E0",
    scroll="#ECEEF2",
    scroll_handle="#C9CED8",
    axis="#B8BEC9",
    axis_text="#5A6272",
    hover="#E8EDF5",
    selected="#D6E2FB",
    selected_border="#3B6FD8",
    button="#FFFFFF",
    button_border="#C3C9D3",
    button_text="#1F2430",
    button_hover="#E8EDF5",
    disabled="#9AA1AD",
    accent="#3B6FD8",
    link="#0550AE",
    banner=("#FFF4D6", "#6E4700", "#E0B85A"),
    tooltip=("#FFFFFF", "#1F2430", "#C3C9D3"),
    code_background="#F6F8FA",
    code_header="#E7EBF0",
    code_header_text="#57606A",
    inline_code="#E6E9EF",
    well="#FFFFFF",
    best_row="#D3EEDD",
    on_bar="#FFFFFF",  # the light map's hues are darkened to 3:1 on white
    card=("rgba(255, 255, 255, 245)", "#1F2430", "#B8BEC9"),
    card_aside="#5A6272",
    card_emphasis="#7A4B00",
    error="#C62839",
    # GitHub's light palette, readable on code_background.
    code_kinds={
        "keyword": "#CF222E",
        "builtin": "#8250DF",
        "constant": "#0550AE",
        "number": "#0550AE",
        "string": "#0A3069",
        "key": "#116329",
        "comment": "#6E7781",
        "meta": "#953800",
    },
)

PALETTES = {"dark": DARK, "light": LIGHT}
_current = [DARK]  # the theme on show; dark until a ThemeKeeper applies one


def current() -> Palette:
    """The palette of the theme on show."""
    return _current[0]


def set_current(theme: str) -> Palette:
    """Called by the ThemeKeeper before it re-styles the application."""
    _current[0] = PALETTES[theme]
    return _current[0]
