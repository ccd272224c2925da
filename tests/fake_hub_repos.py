"""The fake hub's repos, files, fault knobs and request log (tests/fake_hub.py serves them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

LFS_POINTER_SIZE = 134  # what the real hub reports for an LFS pointer file


@dataclass
class Faults:
    """What goes wrong when one file's content is served. Offsets are absolute file offsets.

    `drop_after_bytes`, `stall_after_bytes` and `status` fire for the next `times` content
    responses, then the file is served normally; `corrupt_at` and `rate_bytes_per_s` stay until
    `clear_faults`.
    """

    drop_after_bytes: int | None = None  # cut the connection once the response reaches this offset
    stall_after_bytes: int | None = None  # send nothing more for `stall_s` once at this offset
    stall_s: float = 3600.0
    status: int | None = None  # answer the content request with this status instead
    times: int = 1
    corrupt_at: int | None = None  # flip the byte at this offset in every response
    rate_bytes_per_s: float | None = None


@dataclass
class HubFile:
    """One file of a fake repo, with the hashes the hub publishes for it."""

    path: str
    data: bytes
    sha256: str
    git_oid: str
    lfs: bool


@dataclass
class HubRepo:
    """One fake model repo at one commit."""

    repo_id: str
    commit: str
    files: dict[str, HubFile]
    gated: bool
    downloads: int
    likes: int
    license: str | None
    tags: list[str]
    last_modified: str
    granted_tokens: set[str] = field(default_factory=set)


@dataclass
class SeenRequest:
    """A request the hub got, for tests that check what a client sent; `status` is 0 until
    the answer is sent."""

    method: str
    path: str
    headers: dict[str, str]
    status: int


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
