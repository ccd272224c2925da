"""What the Get a model window writes about repos, files, verdicts and downloads, as plain text.

Kept apart from the widgets so each sentence can be checked without a window: counts as people
read them ("1.2M downloads"), sizes in GiB or MiB, a verdict short enough for a table cell
("fits · 32,768 tokens · 11 × 4k") with the planner's whole sentence for its tooltip, and a
download's speed and time left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the hub modules import huggingface_hub: the window imports them on first use
    from kvscope.app.core.hub.pull import PullProgress
    from kvscope.app.core.hub.search import FitVerdict, HubFile, HubRepo

CHECKING = "checking…"


def count(n: int) -> str:
    """1234567 -> "1.2M", 5300 -> "5.3K", 42 -> "42"."""
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def size(n: int) -> str:
    """Bytes as GiB from one GiB up, else MiB (KiB for the smallest files)."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.0f} KiB"


def repo_line(repo: HubRepo) -> str:
    """The repo list's second line: downloads, likes, updated, licence (what the hub gave)."""
    parts = []
    if repo.downloads or repo.likes or repo.updated:
        parts.append(f"{count(repo.downloads)} downloads")
        parts.append(f"{count(repo.likes)} likes")
    if repo.updated:
        parts.append(f"updated {repo.updated[:10]}")
    parts.append(f"licence: {repo.license}" if repo.license else "licence not stated")
    return " · ".join(parts)


def repo_brief(repo: HubRepo) -> str:
    """repo_line for a narrow list, a line each: "↓ 1.2M · ♥ 340 · updated 2025-03-01", then
    the licence (a curated repo, which the hub was not asked about, has the licence only)."""
    lines = []
    if repo.downloads or repo.likes or repo.updated:
        stats = [f"↓ {count(repo.downloads)}", f"♥ {count(repo.likes)}"]
        if repo.updated:
            stats.append(f"updated {repo.updated[:10]}")
        lines.append(" · ".join(stats))
    lines.append(repo.license or "licence not stated")
    return "\n".join(lines)


def short_tokens(n: int) -> str:
    """4096 -> "4k", 131072 -> "128k", 512 -> "512"."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def verdict_cell(verdict: FitVerdict) -> str:
    """One table cell: whether it fits, the longest context one chat can have, and how many
    chats of the typical length fit at once ("✓ fits · 32k tok · 11 × 4k")."""
    if not verdict.runnable:
        return "✗ cannot run here"
    if not verdict.fits:
        return "✗ does not fit"
    typical = short_tokens(verdict.typical_context)
    return f"✓ fits · {short_tokens(verdict.max_context)} tok · {verdict.sequences:,} × {typical}"


def verdict_sentence(hub_file: HubFile, verdict: FitVerdict) -> str:
    """The details line under the table: the file, then the planner's own sentence."""
    where = "" if verdict.runnable else " (the engine cannot run it)"
    return f"{hub_file.file}{where}: {verdict.note}"


def file_label(hub_file: HubFile) -> str:
    """The file's name; a split model says how many parts it comes in."""
    parts = len(hub_file.parts)
    return hub_file.file if parts <= 1 else f"{hub_file.file} (+{parts - 1} parts)"


def duration(seconds: float) -> str:
    """45 -> "45 s", 130 -> "2 min 10 s", 7300 -> "2 h 1 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def progress_line(progress: PullProgress) -> str:
    """ "12.0 MiB of 491.0 MiB · 8.2 MiB/s · 1 min 00 s left", or what the state says."""
    done = f"{size(progress.done_bytes)} of {size(progress.total_bytes)}"
    if not progress.total_bytes:
        done = "asking the hub for the file list…"
    if progress.state == "downloading":
        speed = f"{size(int(progress.bytes_per_s))}/s" if progress.bytes_per_s > 0 else "…"
        left = f" · {duration(progress.eta_s)} left" if progress.eta_s is not None else ""
        line = f"{done} · {speed}{left}"
    elif progress.state == "verifying":
        line = f"{done} · checking the bytes already here (sha256)"
    elif progress.state == "paused":
        line = f"{done} · paused"
    elif progress.state == "done":
        line = f"{size(progress.total_bytes)} · verified, in the Hugging Face cache"
    elif progress.state == "cancelled":
        line = "cancelled: the partial download was deleted"
    else:
        line = done
    quiet = progress.state == "failed" or progress.note in ("", progress.state)
    return line if quiet else f"{line} ({progress.note})"
