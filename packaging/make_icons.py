"""Draw KVScope's icon: a 4x4 pool of KV blocks, some used, some cached, some free.

Writes assets/kvscope.png (256x256) and assets/kvscope.ico (16-256 px). Both are committed; rerun
this only to change the design:  .venv/bin/python packaging/make_icons.py
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

ASSETS = Path(__file__).resolve().parent.parent / "assets"

BACKGROUND = (24, 28, 38, 255)
USED = (76, 175, 80, 255)  # green: blocks holding a running sequence's KV
SHARED = (33, 150, 243, 255)  # blue: blocks shared by several sequences (prefix cache hits)
CACHED = (255, 167, 38, 255)  # orange: free but holding a reusable prefix
FREE = (70, 78, 96, 255)  # grey: free
# Row by row, as the block map would show a pool part-way through serving.
GRID = [
    "SSUU",
    "SUUC",
    "UUCF",
    "UCFF",
]
COLOURS = {"U": USED, "S": SHARED, "C": CACHED, "F": FREE}


def draw(size: int = 256) -> Image.Image:
    scale = 4  # draw large and downsample, for smooth corners
    s = size * scale
    img = Image.new("RGBA", (s, s), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle([0, 0, s - 1, s - 1], radius=s // 6, fill=BACKGROUND)
    margin, gap = s * 0.12, s * 0.035
    cell = (s - 2 * margin - 3 * gap) / 4
    for r, row in enumerate(GRID):
        for c, key in enumerate(row):
            x0 = margin + c * (cell + gap)
            y0 = margin + r * (cell + gap)
            d.rounded_rectangle(
                [x0, y0, x0 + cell, y0 + cell], radius=cell * 0.18, fill=COLOURS[key]
            )
    return img.resize((size, size), Image.LANCZOS)


def main() -> None:
    icon = draw(256)
    icon.save(ASSETS / "kvscope.png")
    icon.save(
        ASSETS / "kvscope.ico",
        sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (128, 128), (256, 256)],
    )
    print(f"wrote {ASSETS / 'kvscope.png'} and {ASSETS / 'kvscope.ico'}")


if __name__ == "__main__":
    main()
