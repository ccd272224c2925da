"""`kvscope search [QUERY] [--json]`: GGUF models on the Hugging Face Hub, and whether they fit.

Without a query it lists the curated small instruct models. Every file gets the engine's verdict
from its GGUF header, read with HTTP Range requests (a few MB per file, never the file): fits or
not on the device the engine would use, the longest context, how many typical sequences fit.
`--json` prints one JSON object per file and line. The hub code is imported only when the command
runs: the parser stays cheap for every other command.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvscope.app.core.hub.search import HubFile, HubRepo, HubSearchError

DEFAULT_REPOS = 5  # each repo holds ~10-25 quants, and each file's header is read


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "search", help="find GGUF models on the Hugging Face Hub and see what fits this machine"
    )
    p.add_argument("query", nargs="?", default="", help="words in the repo name (none: curated)")
    p.add_argument("--json", action="store_true", help="one JSON object per file and line")
    p.add_argument("--limit", type=int, default=DEFAULT_REPOS, help="repos to list (default 5)")
    p.add_argument("--quant", default=None, help="only files of this quant, e.g. Q4_K_M")


def run(args: argparse.Namespace) -> int:
    from kvscope.app.core.hub import search

    try:
        if args.query:
            repos = search.search_models(args.query, limit=args.limit)
        else:
            repos = search.curated_models()[: args.limit]
            for repo in repos:
                repo.files = search.list_files(repo.repo)
    except search.HubSearchError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 1
    wanted = args.quant.upper() if args.quant else None
    for repo in repos:
        repo.files = [f for f in repo.files if wanted is None or f.quant == wanted]
    files = [f for repo in repos for f in repo.files]
    errors: dict[tuple[str, str], HubSearchError] = {}  # (repo, file) whose header failed
    for hub_file, verdict in zip(files, search.judge_files(files), strict=True):
        if isinstance(verdict, search.HubSearchError):
            errors[hub_file.repo, hub_file.file] = verdict
        else:
            hub_file.verdict = verdict
    if args.json:
        for repo in repos:
            for hub_file in repo.files:
                print(json.dumps(_row(repo, hub_file, errors.get((repo.repo, hub_file.file)))))
    else:
        print(_table(repos, errors) if files else f"no GGUF models found for {args.query!r}")
    return 0


def _row(repo: HubRepo, hub_file: HubFile, error: HubSearchError | None) -> dict[str, Any]:
    verdict = hub_file.verdict
    row: dict[str, Any] = {
        "repo": repo.repo,
        "file": hub_file.file,
        "parts": hub_file.parts,
        "quant": hub_file.quant,
        "size_bytes": hub_file.size_bytes,
        "sha256": hub_file.sha256,
        "fits": verdict.fits if verdict else None,
        "max_context": verdict.max_context if verdict else None,
        "note": verdict.note if verdict else error.message if error else None,
        "license": repo.license,
        "downloads": repo.downloads,
        "likes": repo.likes,
        "updated": repo.updated,
    }
    if verdict is not None:
        row |= {
            "runnable": verdict.runnable,
            "device": verdict.device,
            "free_bytes": verdict.free_bytes,
            "weight_bytes": verdict.weight_bytes,
            "typical_context": verdict.typical_context,
            "sequences": verdict.sequences,
            "kv_cache_bytes": verdict.kv_cache_bytes,
        }
    return row


def _table(repos: list[HubRepo], errors: dict[tuple[str, str], HubSearchError]) -> str:
    lines = []
    for repo in repos:
        facts = [f"{repo.downloads:,} downloads", f"{repo.likes:,} likes"]
        facts += [repo.license or "licence not stated"]
        facts += [f"updated {repo.updated[:10]}"] if repo.updated else []
        lines.append(f"{repo.repo}  ({', '.join(facts)})")
        if repo.description:
            lines.append(f"  {repo.description}")
        for hub_file in repo.files:
            verdict = hub_file.verdict
            size = f"{hub_file.size_bytes / 2**30:6.2f} GiB"
            quant = hub_file.quant or "?"
            if verdict is None:
                error = errors.get((repo.repo, hub_file.file))
                lines.append(f"  {quant:<10} {size}  ?      {'':13}  {'':16}  {hub_file.file}")
                lines.append(f"      {error.message if error else 'not judged'}")
                continue
            fits = "fits" if verdict.fits else "no" if verdict.runnable else "can't"
            context = f"{verdict.max_context:>9,} ctx" if verdict.max_context else " " * 13
            seqs = f"{verdict.sequences:>7,} x {verdict.typical_context:<6,}"
            lines.append(f"  {quant:<10} {size}  {fits:<5}  {context}  {seqs}  {hub_file.file}")
            if not verdict.fits:
                lines.append(f"      {verdict.note}")
        lines.append("")
    return "\n".join(lines).rstrip()
