"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} with its status."""

from __future__ import annotations

import json
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

# HTTP status -> the error type OpenAI's API names it with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """A request the server refuses; becomes an OpenAI error body with `status`."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None):
    kind = ERROR_TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code), err.status)


_FASTAPI_PARSE_ERROR = "There was an error parsing the body"
_BRANCH_TAG = re.compile(r"[\[\]-]|^(str|int|float|bool|dict|list|none)$")


def _is_branch_tag(part) -> bool:
    """pydantic names a union's branches in the error's loc ('list[constrained-str]')."""
    return isinstance(part, str) and bool(_BRANCH_TAG.search(part))


def _type_name(tag: str) -> str:
    """'list[constrained-int]' -> 'list of integers', for a message a client can act on."""
    tag = tag.replace("constrained-", "")
    if tag.startswith("list[") and tag.endswith("]"):
        inner = _type_name(tag[5:-1])
        plural = "lists" + inner[4:] if inner.startswith("list of") else inner + "s"
        return "list of " + plural
    return {"str": "string", "int": "integer", "bool": "boolean", "float": "number"}.get(tag, tag)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(), None
    # A union's every branch fails: the branch whose type matched broke a bound (250 stop
    # strings: "at most 4 items"), and that is the message worth sending; if none matched,
    # the message lists the types the field takes.
    field = first.get("loc", ())[:2]
    same = [e for e in errors if tuple(e.get("loc", ()))[:2] == tuple(field)]
    matched = [e for e in same if not e.get("type", "").endswith("_type")]
    chosen = matched[0] if matched else first
    loc = [str(p) for p in chosen.get("loc", ()) if p != "body" and not _is_branch_tag(p)]
    param = ".".join(loc) or None
    got = first.get("input")
    try:
        shown = json.dumps(got)[:80]
    except (TypeError, ValueError):
        shown = repr(got)[:80]
    message = chosen.get("msg", "invalid")
    tags = [p for e in same for p in e.get("loc", ()) if _is_branch_tag(p)]
    if not matched and len(same) > 1 and tags:
        kinds = list(dict.fromkeys(_type_name(t) for t in tags))
        message = "should be " + (
            " or ".join(kinds) if len(kinds) < 3 else ", ".join(kinds[:-1]) + " or " + kinds[-1]
        )
        param = ".".join(str(p) for p in field if p != "body" and not _is_branch_tag(p)) or None
    return f"{param or 'body'}: {message} (got {shown})", param


def install_error_handlers(app: FastAPI) -> None:
    """Every failure answers with an OpenAI error body; none of them stops the server."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == _FASTAPI_PARSE_ERROR:
            # What JSON's own errors are not: a body nested deeper than the parser recurses
            # (a 3,000-deep JSON Schema).
            detail = "the body could not be parsed: JSON nested too deeply"
        # Starlette's own headers stay (a 405's Allow: HTTP requires it).
        return JSONResponse(
            error_body(exc.status_code, detail), exc.status_code, headers=exc.headers
        )
