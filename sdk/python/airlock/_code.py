"""Code contexts: run code in long-lived interpreters that keep state."""

from __future__ import annotations

import base64
import http.client
import json
from dataclasses import dataclass, field
from typing import Callable

from ._errors import StreamBroken

# MIME types sent as text on the wire (api/openapi.yaml, CodeEvent); every
# other type is base64.
_TEXT_SUFFIXES = ("+json", "+xml")
_TEXT_TYPES = ("image/svg+xml", "application/json", "application/javascript")

_MAX_LINE = 32 * 1024 * 1024


def ndjson_records(
    resp: http.client.HTTPResponse, ident: Callable[[], str | None], what: str, max_line: int = _MAX_LINE
):
    """Yield the JSON objects of an NDJSON stream. Raises StreamBroken (with
    the exec id ``ident()`` returns at that moment) if the stream breaks, a
    record is cut off or longer than max_line, or a line is not a JSON
    object; the caller stops at its final record."""
    while True:
        exec_id = ident()
        try:
            line = resp.readline(max_line + 1)
        except (OSError, http.client.HTTPException) as e:
            raise StreamBroken(exec_id, f"stream broken: {e}") from e
        if not line:
            raise StreamBroken(exec_id, f"stream ended before the {what} record")
        if not line.endswith(b"\n"):
            raise StreamBroken(exec_id, "record too long" if len(line) > max_line else "stream ended inside a record")
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise StreamBroken(exec_id, f"bad record: {e}") from e
        if not isinstance(rec, dict):
            raise StreamBroken(exec_id, "bad record: not an object")
        yield rec


def _is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(_TEXT_SUFFIXES)


@dataclass
class CodeError:
    """An exception raised by the code (not a failure of airlock)."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


class Result(dict):
    """One rich value of a code run: a MIME bundle (a dict of MIME type ->
    value: text types as str, images such as image/png and image/jpeg as
    bytes). ``main`` is True for the value of the last expression, False for
    display() and figure outputs. ``file`` is the guest path of a file that
    ``return_files`` sent (relative to the context's directory when under
    it), None for the code's own results; it is the guest's text: escape it
    before printing it to a terminal."""

    main: bool = False
    file: str | None = None


@dataclass
class Execution:
    """What running code produced. ``results`` are Result MIME bundles (dicts:
    text types as str, images as bytes), the files ``return_files`` asked for
    among them (``Result.file`` set). ``main`` is the value of the last
    expression, if any. ``status`` holds the server's words on the run's
    progress while the context's interpreter started ("starting python
    context", ...), never the code's output; they also go to ``on_status``
    as they arrive."""

    stdout: bytes = b""
    stderr: bytes = b""
    results: list[Result] = field(default_factory=list)
    main: Result | None = None
    error: CodeError | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_ms: int = 0
    execution_count: int = 0
    context: str = ""
    status: list[str] = field(default_factory=list)

    @property
    def text(self) -> str | None:
        """The main result's text/plain, if any."""
        return None if self.main is None else self.main.get("text/plain")

    @property
    def files(self) -> dict[str, Result]:
        """The results ``return_files`` sent, by guest path."""
        return {r.file: r for r in self.results if r.file is not None}


def decode_bundle(data: dict) -> Result:
    return Result({m: (v if _is_text(m) else base64.b64decode(v)) for m, v in (data or {}).items()})


def read_code_stream(
    resp: http.client.HTTPResponse,
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
    on_result: Callable[[Result], None] | None,
    on_status: Callable[[str], None] | None = None,
) -> Execution:
    """Parse a code NDJSON stream up to its end record. A stream that ends
    early raises StreamBroken, with the reason the server gave (an error
    record named AirlockError) if it gave one."""
    ex = Execution()
    try:
        return _read_code_records(resp, ex, on_stdout, on_stderr, on_result, on_status)
    except StreamBroken as e:
        if ex.error is not None and ex.error.name == "AirlockError" and e.message != "record too long":
            raise StreamBroken(None, f"{ex.error.value}: {e.message}") from e
        raise


def _read_code_records(
    resp: http.client.HTTPResponse,
    ex: Execution,
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
    on_result: Callable[[Result], None] | None,
    on_status: Callable[[str], None] | None,
) -> Execution:
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    cbs = {"stdout": on_stdout, "stderr": on_stderr}
    for rec in ndjson_records(resp, lambda: None, "end"):
        kind = rec.get("type")
        if kind in ("stdout", "stderr"):
            data = str(rec.get("data", "")).encode()
            if cbs[kind] is not None:
                cbs[kind](data)
            else:
                out[kind].append(data)
        elif kind == "result":
            try:
                bundle = decode_bundle(rec.get("data"))
            except ValueError as e:
                raise StreamBroken(None, f"bad result: {e}") from e
            bundle.main = bool(rec.get("main"))
            if rec.get("file"):
                bundle.file = str(rec.get("file"))
            ex.results.append(bundle)
            if bundle.main:
                ex.main = bundle
            if on_result is not None:
                on_result(bundle)
        elif kind == "status":
            line = str(rec.get("data", ""))
            ex.status.append(line)
            if on_status is not None:
                on_status(line)
        elif kind == "error":
            ex.error = CodeError(str(rec.get("name", "")), str(rec.get("value", "")), list(rec.get("traceback") or []))
        elif kind == "end":
            ex.stdout, ex.stderr = b"".join(out["stdout"]), b"".join(out["stderr"])
            ex.timed_out = bool(rec.get("timed_out"))
            ex.truncated = bool(rec.get("truncated"))
            ex.duration_ms = int(rec.get("duration_ms") or 0)
            ex.execution_count = int(rec.get("execution_count") or 0)
            ex.context = str(rec.get("context") or "")
            return ex
        # Unknown record types are ignored (forward compatibility).
