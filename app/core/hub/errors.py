"""The errors a pull reports, in words a user can act on."""

from __future__ import annotations


class PullError(Exception):
    """A pull that cannot go on; `message` says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PullCancelled(PullError):
    """The user cancelled the pull; its partial bytes are gone."""
