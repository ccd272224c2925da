"""A failed hub request in words a user can act on, the same for search, header reads and pulls.

`huggingface_hub` raises typed errors (gated, not found, a revision or file missing, offline)
and its HTTP library transport ones; each is said here once, naming the repo or file and the way
out: accept the licence and set a token, check the name, the network, a proxy or HF_ENDPOINT.
Subclasses are checked first: a gated repo's error is also a not-found and an HTTP error.
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
from huggingface_hub.utils import build_hf_headers

# The HTTP library huggingface_hub's session is built on (httpx2 since huggingface_hub 2.0).
from huggingface_hub.utils import httpx as hub_httpx

OFFLINE = "offline: HF_HUB_OFFLINE is set, so the hub is not asked"


def describe_hub_error(error: Exception, repo: str | None = None, file: str | None = None) -> str:
    """What went wrong with `repo` (and `file` in it), from huggingface_hub's or its HTTP
    library's error."""
    endpoint = constants.ENDPOINT
    where = f"{repo}/{file}" if repo and file else repo or endpoint
    status = _status(error)
    if isinstance(error, GatedRepoError):
        has_token = "authorization" in {k.lower() for k in build_hf_headers()}
        why = "your token (HF_TOKEN) has no access to it yet" if has_token else "no token was sent"
        return (
            f"{repo} is gated (HTTP {status}): {why}. Accept the licence on the model's page"
            f" ({endpoint}/{repo}) and set a token (HF_TOKEN, or `hf auth login`) from"
            f" {endpoint}/settings/tokens."
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"{repo} was not found on {endpoint}. Check the name; a private repo also needs a"
            " token in HF_TOKEN."
        )
    if isinstance(error, RemoteEntryNotFoundError):
        return f"{file} is not in {repo} (HTTP 404): was it removed? List it at {endpoint}/{repo}."
    if isinstance(error, RevisionNotFoundError):
        return f"{repo} has no such revision (HTTP 404)."
    if isinstance(error, OfflineModeIsEnabled):
        return OFFLINE
    if isinstance(error, HfHubHTTPError):
        # The server's own words, not the HTTP library's paragraph with a link to MDN.
        said = f": {error.server_message.strip()}" if error.server_message else ""
        if status == 401:
            return f"the hub refused the token in HF_TOKEN (HTTP 401) for {where}{said}"
        return f"the hub answered HTTP {status} for {where}{said}"
    if isinstance(error, hub_httpx.TimeoutException):
        return f"no answer from {endpoint} in time for {where}"
    if isinstance(error, hub_httpx.TransportError):
        return (
            f"cannot reach {endpoint} ({type(error).__name__}: {error}); check the network,"
            " a proxy, or HF_ENDPOINT for a mirror"
        )
    return f"{where}: {type(error).__name__}: {error}"


def _status(error: Exception) -> int | str:
    response = getattr(error, "response", None)
    return response.status_code if response is not None else "an error"
