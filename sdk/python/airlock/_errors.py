"""Exceptions raised by the airlock client."""

from __future__ import annotations

import http
import json


class AirlockError(Exception):
    """An error answered by the airlock API (a non-2xx status).

    ``status`` is the HTTP status, ``code`` the contract's error code
    ("not_found", "invalid", ...), ``message`` the server's public message and
    ``request_id`` the id to quote when reporting a problem.
    """

    def __init__(self, status: int, code: str, message: str, request_id: str | None = None):
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        text = f"{code} ({status}): {message}" if status else f"{code}: {message}"
        if request_id:
            text += f" [request_id {request_id}]"
        super().__init__(text)


class InvalidRequest(AirlockError):
    """400 invalid: a malformed request or an unsupported option."""


class Unauthenticated(AirlockError):
    """401 unauthenticated: missing or bad API key."""


class PermissionDenied(AirlockError):
    """403 permission_denied: the key may not do this (e.g. publish host ports
    without an admin key)."""


class NotFound(AirlockError):
    """404 not_found: no such sandbox, exec or file (or not yours)."""


class Conflict(AirlockError):
    """409 conflict: the resource is in the wrong state for the request."""


class FailedPrecondition(AirlockError):
    """412 failed_precondition: the sandbox is not in a state for this (e.g.
    pause while code runs, without force)."""


class ExecNotStarted(AirlockError):
    """422 exec_not_started: the sandbox is fine but the guest could not start
    the command (no such executable, working directory or user; a file that
    is not executable). Not a NotFound: the sandbox still exists."""


class QuotaExceeded(AirlockError):
    """429 resource_exhausted: a quota or rate limit; the message names it."""


class InsufficientStorage(AirlockError):
    """507 insufficient_storage: the server's disk cannot take this now (a
    create, fork, pause or snapshot would eat into the free space it keeps);
    retry later or ask for less."""


class StreamBroken(AirlockError):
    """An exec output stream ended before its exit record.

    The command keeps running (unless started with kill_on_disconnect);
    ``exec_id`` (None if the stream broke before naming it) can be passed to
    ``Sandbox.attach``.
    """

    def __init__(self, exec_id: str | None, reason: str):
        self.exec_id = exec_id
        super().__init__(0, "stream_broken", reason)


class ExecPaused(StreamBroken):
    """An exec output stream ended because the sandbox was paused.

    The command is parked in the guest and goes on, under the same
    ``exec_id``, when the sandbox resumes; ``Sandbox.attach`` resumes the
    sandbox and picks it up again.
    """

    def __init__(self, exec_id: str | None, reason: str):
        super().__init__(exec_id, reason)
        self.code = "exec_paused"


_BY_CODE = {
    "invalid": InvalidRequest,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "conflict": Conflict,
    "failed_precondition": FailedPrecondition,
    "exec_not_started": ExecNotStarted,
    "resource_exhausted": QuotaExceeded,
    "insufficient_storage": InsufficientStorage,
}

_CODE_BY_STATUS = {
    400: "invalid",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "conflict",
    412: "failed_precondition",
    413: "too_large",
    422: "exec_not_started",
    429: "resource_exhausted",
    503: "unavailable",
    507: "insufficient_storage",
}


def error_from_response(status: int, body: bytes, header_request_id: str | None) -> AirlockError:
    """Build the exception for a non-2xx response (contract body or not)."""
    code = message = request_id = None
    try:
        err = json.loads(body)["error"]
        code, message, request_id = err.get("code"), err.get("message"), err.get("request_id")
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()
        message = text[:200] + ("..." if len(text) > 200 else "")
    code = code or _CODE_BY_STATUS.get(status, "internal")
    if not message:
        try:
            message = http.HTTPStatus(status).phrase
        except ValueError:
            message = f"HTTP {status}"
    cls = _BY_CODE.get(code, AirlockError)
    return cls(status, code, message, request_id or header_request_id)
