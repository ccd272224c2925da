"""Why a search or a header read failed, in words a user can act on.

`huggingface_hub` raises typed errors (gated, not found, a revision or file missing) and httpx
its transport ones; each becomes a HubSearchError whose message names the repo and the way out
(accept the licence and set a token, check the name, the network or HF_ENDPOINT).
"""

from __future__ import annotations

from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

# The HTTP library huggingface_hub's session is built on (httpx2 since huggingface_hub 2.0).
from huggingface_hub.utils import httpx as hub_httpx


class HubSearchError(Exception):
    """A hub request that failed; the message says why and what would help."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_online() -> None:
    """Refuse at once, in words, when the user asked huggingface_hub to stay offline."""
    if constants.HF_HUB_OFFLINE:
        raise HubSearchError("offline: HF_HUB_OFFLINE is set, so the hub is not asked")


def hub_search_error(
    error: Exception, repo: str | None = None, path: str | None = None
) -> HubSearchError:
    """`error` from huggingface_hub or httpx, said in words (checked subclasses first: a gated
    repo's error is also an HTTP error)."""
    endpoint = constants.ENDPOINT
    where = f"{repo}/{path}" if repo and path else repo or endpoint
    if isinstance(error, GatedRepoError):
        return HubSearchError(
            f"{repo} is gated: accept its licence on {endpoint}/{repo} and set a token "
            "(HF_TOKEN, or `hf auth login`)"
        )
    if isinstance(error, RepositoryNotFoundError):
        return HubSearchError(
            f"no model repo {repo} on {endpoint} (check the name; a private repo needs a token)"
        )
    if isinstance(error, RevisionNotFoundError):
        return HubSearchError(f"{repo} has no such revision: {error}")
    if isinstance(error, RemoteEntryNotFoundError):
        return HubSearchError(f"{repo} has no file {path}")
    if isinstance(error, OfflineModeIsEnabled):
        return HubSearchError("offline: HF_HUB_OFFLINE is set, so the hub is not asked")
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "an error"
        return HubSearchError(f"the hub answered {status} for {where}: {error}")
    if isinstance(error, hub_httpx.TimeoutException):
        return HubSearchError(f"no answer from {endpoint} in time for {where}")
    if isinstance(error, hub_httpx.TransportError):
        return HubSearchError(
            f"cannot reach {endpoint} ({type(error).__name__}: {error}); check the network, "
            "a proxy, or HF_ENDPOINT for a mirror"
        )
    return HubSearchError(f"{where}: {type(error).__name__}: {error}")
