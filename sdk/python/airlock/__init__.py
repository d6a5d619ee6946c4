"""Python client for the airlock sandbox HTTP API (standard library only; terminals use websocket-client).

    import airlock
    client = airlock.Client()          # $AIRLOCK_HOST, $AIRLOCK_API_KEY
    with client.create() as sb:        # killed on exit
        print(sb.exec(["python3", "-c", "print(6*7)"]).stdout)
"""

from ._client import Client, ExecResult, FileList, Sandbox, __version__
from ._code import CodeError, Execution, Result
from ._terminal import Terminal
from ._errors import (
    AirlockError,
    Conflict,
    ExecNotStarted,
    ExecPaused,
    FailedPrecondition,
    InsufficientStorage,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    StreamBroken,
    Unauthenticated,
)

__all__ = [
    "AirlockError",
    "Client",
    "CodeError",
    "Conflict",
    "ExecResult",
    "Execution",
    "ExecNotStarted",
    "ExecPaused",
    "FailedPrecondition",
    "FileList",
    "InsufficientStorage",
    "InvalidRequest",
    "NotFound",
    "PermissionDenied",
    "QuotaExceeded",
    "Result",
    "Sandbox",
    "StreamBroken",
    "Terminal",
    "Unauthenticated",
    "__version__",
]
