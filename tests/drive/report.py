"""The drive's results: drive.json (every figure), rss.png (RSS and stalls over time), and the
window's screenshots in both themes at 1024x700 and 1400x860.

The summary states the issue's two checks as numbers: RSS on the bundled model after the first
model switch (first, last, max, and the fitted slope in MiB per hour), and the longest GUI stall
with what the drive was doing and where the GUI thread was.
"""

from __future__ import annotations

import json
from pathlib import Path

SCREEN_SIZES = ((1024, 700), (1400, 860))


def rss_summary(samples: list[dict], events: list[dict]) -> dict:
    if not samples:
        return {}
    samples = [s for s in samples if s["model"] != "closed"]  # the window's life only
    if not samples:
        return {}
    rss = [s["rss_mib"] for s in samples]
    out = {
        "samples": len(samples),
        "first_mib": rss[0],
        "max_mib": max(rss),
        "last_mib": rss[-1],
        "min_mib": min(rss),
    }
    first_switch = events[0]["t_s"] if events else None
    if first_switch is not None:
        # "Flat after the first switch": the bundled model's samples once it has switched.
        after = [s for s in samples if s["t_s"] > first_switch and s["model"] == "bundled"]
        if after:
            values = [s["rss_mib"] for s in after]
            out["bundled_after_first_switch"] = {
                "samples": len(after),
                "first_mib": values[0],
                "last_mib": values[-1],
                "min_mib": min(values),
                "max_mib": max(values),
                "slope_mib_per_hour": _slope(after),
            }
    by_model: dict[str, list[float]] = {}
    for s in samples:
        by_model.setdefault(s["model"], []).append(s["rss_mib"])
    out["by_model"] = {m: {"max_mib": max(v), "last_mib": v[-1]} for m, v in by_model.items()}
    return out


def _slope(samples: list[dict]) -> float | None:
    """Least-squares MiB per hour; None with fewer than three samples or no time between."""
    if len(samples) < 3:
        return None
    ts = [s["t_s"] / 3600 for s in samples]
    ys = [s["rss_mib"] for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return round(sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var, 1)


def worst_stall(stalls: list[dict]) -> dict | None:
    return max(stalls, key=lambda s: s["late_ms"]) if stalls else None


def write_json(path: Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")


def plot(path: Path, samples: list[dict], stalls: list[dict], events: list[dict]) -> None:
    """RSS over time (one colour per model, a line at each switch) over the stalls' lateness."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    colours = {"bundled": "tab:blue", "other": "tab:orange", "closed": "tab:gray"}
    for model in dict.fromkeys(s["model"] for s in samples):
        pts = [s for s in samples if s["model"] == model]
        top.plot(
            [s["t_s"] / 60 for s in pts],
            [s["rss_mib"] for s in pts],
            ".",
            color=colours.get(model, "tab:gray"),
            label="after the window closed" if model == "closed" else f"on the {model} model",
        )
    top.plot([s["t_s"] / 60 for s in samples], [s["rss_mib"] for s in samples], "-", lw=0.6,
             color="tab:gray")  # fmt: skip
    for e in events:
        top.axvline(e["t_s"] / 60, color="tab:red", ls="--", lw=0.8)
    top.set_ylabel("RSS (MiB)")
    top.set_title("KVScope long drive: process RSS (psutil, every 10 s); dashed: model switch")
    top.legend(loc="lower right")
    top.grid(alpha=0.3)
    if stalls:
        bottom.plot([s["t_s"] / 60 for s in stalls], [s["late_ms"] for s in stalls], "rx")
    bottom.axhline(200, color="tab:gray", ls=":", lw=0.8)
    bottom.set_ylabel("GUI stall (ms)")
    bottom.set_xlabel("minutes")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
