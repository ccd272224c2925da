"""Why a search or a header read failed, in words a user can act on, and said early.

Each error becomes a HubSearchError worded by hub_errors.py, as a pull's errors are. Before a
search asks anything, one request without retries checks that the hub answers at all:
huggingface_hub retries a failed listing with backoff (five tries, ~27 s against a refused
port) and logs every try, where a user at the search box wants the reason at once.
"""

from __future__ import annotations

import threading
import time

from huggingface_hub import constants
from huggingface_hub.utils import get_session

from kvscope.app.core.hub.hub_errors import OFFLINE, describe_hub_error

REACH_TIMEOUT_S = 5.0
_REACHED_FOR_S = 60.0  # an answer this recent stands for the hub being there
_reached: dict[str, float] = {}  # endpoint -> when it last answered
_reached_lock = threading.Lock()


class HubSearchError(Exception):
    """A hub request that failed; the message says why and what would help."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_online() -> None:
    """Refuse at once, in words, when the user asked huggingface_hub to stay offline or the
    hub (HF_ENDPOINT) does not answer one request."""
    if constants.HF_HUB_OFFLINE:
        raise HubSearchError(OFFLINE)
    endpoint = constants.ENDPOINT
    with _reached_lock:
        if time.monotonic() - _reached.get(endpoint, -_REACHED_FOR_S) < _REACHED_FOR_S:
            return
    try:
        get_session().head(endpoint, timeout=REACH_TIMEOUT_S)  # any status: it answered
    except Exception as e:  # no route, no name, refused, timed out, a bad proxy
        raise hub_search_error(e) from e
    with _reached_lock:
        _reached[endpoint] = time.monotonic()


def hub_reachable() -> bool:
    """Whether a search could ask the hub now (online, and it answers)."""
    try:
        check_online()
    except HubSearchError:
        return False
    return True


def hub_search_error(
    error: Exception, repo: str | None = None, path: str | None = None
) -> HubSearchError:
    """`error` from huggingface_hub or its HTTP library, said in words."""
    return HubSearchError(describe_hub_error(error, repo, path))
