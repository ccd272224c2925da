"""ParamError: a request parameter the engine refuses, naming the field (the server's 400)."""

from __future__ import annotations


class ParamError(ValueError):
    """A bad sampling parameter; `param` names it (the server's 400 says which field)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
