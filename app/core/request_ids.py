"""The request id format, in one place: "{group}/{suffix}".

A chat's replies are "conv-{conversation id}/r{n}", a simulated user's requests "load-{user}/{k}",
an HTTP client's (`kvscope serve`) "api-{client}/{k}".
The group (the part before the first '/') names who asked: the block map colours by it and the
window turns a conversation's group back into its id. Any other id is a group of its own.
"""

from __future__ import annotations

from functools import lru_cache

CONVERSATION_PREFIX = "conv-"
LOAD_PREFIX = "load-"
API_PREFIX = "api-"


def conversation_group(conversation_id: int) -> str:
    """The group of every reply in a conversation: "conv-12"."""
    return f"{CONVERSATION_PREFIX}{conversation_id}"


def conversation_request_id(conversation_id: int, n: int) -> str:
    """The id of a conversation's n-th reply request: "conv-12/r3"."""
    return f"{conversation_group(conversation_id)}/r{n}"


def load_request_id(user: int, k: int) -> str:
    """The id of a simulated user's k-th request: "load-3/7"."""
    return f"{LOAD_PREFIX}{user}/{k}"


def api_request_id(client: str, k: int) -> str:
    """The id of an HTTP client's k-th request: "api-editor/7". `client` is the label the
    server derived (the request's `user` field, sanitized), so each client gets its colour."""
    return f"{API_PREFIX}{client}/{k}"


@lru_cache(maxsize=65536)  # the block map asks for every sequence of every snapshot
def group_of(request_id: str) -> str:
    """The group of a request id: everything before the first '/'."""
    return request_id.split("/", 1)[0]


def conversation_of_group(group: str) -> int | None:
    """The conversation id a group names ("conv-12" -> 12), None for any other group."""
    number = group.removeprefix(CONVERSATION_PREFIX)
    if number == group or not number.isdecimal():
        return None
    return int(number)
