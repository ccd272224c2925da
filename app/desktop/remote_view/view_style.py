"""The remote view's stylesheet: its own, so that it holds in the light theme too."""

# Dark in both themes, as the block map is (assets/style_light.qss keeps #blockMapPanel dark):
# the replica colours are the map's palette, chosen for a dark ground. This sheet is the
# view's own, so it wins over the application's light rules for every widget inside.
VIEW_STYLE = (
    "QWidget { background: #101216; color: #C9CED6; }"
    " QSplitter::handle { background: #22262E; }"
    " QTextBrowser { background: #15171C; border: 1px solid #2C313B; color: #D5D9E0;"
    " font-size: 11px; }"
    " QLineEdit { background: #1B2028; border: 1px solid #2A303B; border-radius: 6px;"
    " padding: 4px 6px; color: #D7DCE4; }"
    " QLineEdit:focus { border: 1px solid #4F8CFF; }"
    " QPushButton, QToolButton { background: #232A35; border: 1px solid #2F3744;"
    " border-radius: 6px; padding: 5px 12px; color: #D7DCE4; }"
    " QPushButton:hover, QToolButton:hover { background: #2B3441; }"
    " QPushButton:disabled, QToolButton:disabled { color: #5D6675; }"
    " QTabBar::tab { background: #1A1D23; color: #A9B0BD; padding: 4px 12px;"
    " border: 1px solid #2C313B; border-bottom: none; }"
    " QTabBar::tab:selected { background: #262A33; color: #E8EAED; }"
    " QToolTip { background: #222833; color: #E6E9EE; border: 1px solid #3A4352; }"
)
