"""The JSON the fake hub answers with: the shapes of the real Hub's /api/models routes that
`huggingface_hub` parses (tests/fake_hub.py)."""

from __future__ import annotations

import hashlib
from typing import Any

from fake_hub_repos import LFS_POINTER_SIZE, HubFile, HubRepo


def flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[0].lower() in ("true", "1")


def sort_key(repo: HubRepo, sort: str) -> Any:
    if sort == "likes":
        return repo.likes
    if sort in ("lastModified", "createdAt"):
        return repo.last_modified
    return repo.downloads  # downloads, and trendingScore as the fake hub's stand-in for it


def summary(repo: HubRepo) -> dict[str, Any]:
    """What the real hub lists per model when no `expand` is asked for."""
    return {
        "_id": repo.commit[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "likes": repo.likes,
        "trendingScore": repo.downloads // 100,
        "private": False,
        "downloads": repo.downloads,
        "tags": list(repo.tags),
        "pipeline_tag": "text-generation",
        "library_name": "gguf" if "gguf" in repo.tags else None,
        "createdAt": repo.last_modified,
    }


def details(repo: HubRepo) -> dict[str, Any]:
    return {
        "author": repo.repo_id.split("/")[0],
        "sha": repo.commit,
        "lastModified": repo.last_modified,
        "gated": "manual" if repo.gated else False,
        "disabled": False,
    }


def card(repo: HubRepo) -> dict[str, Any]:
    return {"license": repo.license} if repo.license is not None else {}


def expanded(row: dict[str, Any], repo: HubRepo, query: dict[str, list[str]]) -> dict[str, Any]:
    """With `expand`, the hub answers the id and exactly the properties asked for."""
    if "expand" not in query:
        return row
    everything = {**summary(repo), **details(repo), "cardData": card(repo)}
    everything["siblings"] = [{"rfilename": p} for p in sorted(repo.files)]
    everything["usedStorage"] = sum(len(f.data) for f in repo.files.values())
    fields = query["expand"]
    return {"_id": row["_id"], "id": row["id"], **{k: everything.get(k) for k in fields}}


def sibling(hub_file: HubFile, blobs: bool) -> dict[str, Any]:
    if not blobs:
        return {"rfilename": hub_file.path}
    sibling: dict[str, Any] = {
        "rfilename": hub_file.path,
        "size": len(hub_file.data),
        "blobId": hub_file.git_oid,
    }
    if hub_file.lfs:
        sibling["lfs"] = {
            "size": len(hub_file.data),
            "sha256": hub_file.sha256,
            "pointerSize": LFS_POINTER_SIZE,
        }
    return sibling


def file_entry(hub_file: HubFile) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": "file",
        "oid": hub_file.git_oid,
        "size": len(hub_file.data),
        "path": hub_file.path,
    }
    if hub_file.lfs:
        entry["lfs"] = {
            "oid": hub_file.sha256,
            "size": len(hub_file.data),
            "pointerSize": LFS_POINTER_SIZE,
        }
    return entry


def directory_entry(path: str) -> dict[str, Any]:
    return {
        "type": "directory",
        "oid": hashlib.sha1(path.encode()).hexdigest(),
        "size": 0,
        "path": path,
    }
