"""Terminals: a command on a pseudo-terminal in the guest, over the API's
WebSocket (GET /v1/sandboxes/{id}/pty).

The WebSocket client is the ``websocket-client`` library (Debian:
python3-websocket; pip: ``airlock-sandbox[terminal]``), imported only when a
terminal is opened, so the rest of the SDK stays standard library only.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
from typing import TYPE_CHECKING, Any, Mapping

from ._errors import AirlockError, ExecPaused, StreamBroken, error_from_response

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client, ExecResult

# The largest control message (JSON text) a terminal accepts from the server.
_MAX_CONTROL = 64 * 1024


def _websocket():
    try:
        import websocket  # websocket-client
    except ImportError as e:  # pragma: no cover - depends on the host
        raise ImportError(
            "airlock: terminals need the websocket-client package "
            "(apt-get install python3-websocket, or pip install 'airlock-sandbox[terminal]')"
        ) from e
    return websocket


class Terminal:
    """A command running on a terminal in the guest.

    Output is the terminal's bytes (the command's output with the echo of
    what was typed), read with ``read``; input goes in with ``send``. The
    exec is the sandbox's like any other (``exec_id``): with ``keep=True`` it
    survives ``close`` and ``Sandbox.terminal(exec_id=...)`` re-attaches,
    replaying the output retained so far. Not safe for use from several
    threads at once, except ``send``/``resize``/``signal`` from one thread
    while another reads.
    """

    def __init__(self, ws: Any, sandbox_id: str):
        self._ws = ws
        self.sandbox_id = sandbox_id
        self.exec_id: str = ""
        self.pid: int = 0
        self._exit: dict | None = None
        first = self._recv_control()
        if first is None or first.get("type") != "started":
            self.close()
            raise StreamBroken(None, f"terminal: the server's first message was not 'started': {first!r}")
        self.exec_id = str(first.get("exec_id", ""))
        self.pid = int(first.get("pid", 0))

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<airlock.Terminal {self.exec_id} of {self.sandbox_id}>"

    @property
    def exited(self) -> bool:
        """True once the command's exit has been read."""
        return self._exit is not None

    def send(self, data: bytes | str) -> None:
        """Type ``data`` (str is sent as UTF-8)."""
        if isinstance(data, str):
            data = data.encode()
        self._ws.send_binary(data)

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size (1-10000 each)."""
        self._control({"type": "resize", "rows": int(rows), "cols": int(cols)})

    def signal(self, sig: int) -> None:
        """Send signal ``sig`` to the command's process group."""
        self._control({"type": "signal", "signal": int(sig)})

    def kill(self) -> None:
        """SIGKILL the command."""
        self.signal(9)

    def _control(self, msg: dict) -> None:
        self._ws.send(json.dumps(msg))

    def read(self, timeout: float | None = None) -> bytes:
        """The next output bytes; b"" once the command exited (then ``wait``
        returns its exit at once). Raises TimeoutError if nothing came within
        ``timeout`` seconds (None: wait as long as it takes)."""
        ws = _websocket()
        while self._exit is None:
            self._ws.settimeout(timeout)
            try:
                opcode, data = self._ws.recv_data()
            except ws.WebSocketTimeoutException as e:
                raise TimeoutError(f"terminal {self.exec_id}: no output within {timeout}s") from e
            except ws.WebSocketConnectionClosedException as e:
                raise StreamBroken(self.exec_id, "the terminal's socket closed before the exit") from e
            if opcode == ws.ABNF.OPCODE_BINARY:
                if data:
                    return data
                continue
            if opcode == ws.ABNF.OPCODE_TEXT:
                self._on_control(data)
                continue
            if opcode == ws.ABNF.OPCODE_CLOSE:
                raise StreamBroken(self.exec_id, "the server closed the terminal before the exit")
        return b""

    def _recv_control(self) -> dict | None:
        ws = _websocket()
        try:
            opcode, data = self._ws.recv_data()
        except ws.WebSocketConnectionClosedException:
            return None
        if opcode != ws.ABNF.OPCODE_TEXT:
            return None
        return self._decode(data)

    def _decode(self, data: bytes) -> dict:
        if len(data) > _MAX_CONTROL:
            raise StreamBroken(self.exec_id, f"terminal: a control message of {len(data)} bytes")
        try:
            msg = json.loads(data)
        except ValueError as e:
            raise StreamBroken(self.exec_id, f"terminal: a control message is not JSON: {e}") from e
        if not isinstance(msg, dict):
            raise StreamBroken(self.exec_id, "terminal: a control message is not an object")
        return msg

    def _on_control(self, data: bytes) -> None:
        msg = self._decode(data)
        kind = msg.get("type")
        if kind == "exit":
            ex = msg.get("exit")
            self._exit = ex if isinstance(ex, dict) else {}
        elif kind == "paused":
            # The sandbox was paused; the command goes on when it resumes.
            raise ExecPaused(str(msg.get("exec_id") or self.exec_id), str(msg.get("error") or "the sandbox was paused"))
        elif kind == "error":
            raise AirlockError(400, "terminal_control", str(msg.get("error", "")))
        # Unknown control types from a newer server are ignored.

    def wait(self, timeout: float | None = None) -> "ExecResult":
        """Read until the command exits and return how it ended, with the
        output read meanwhile in ``stdout`` (a terminal has one stream)."""
        from ._client import ExecResult

        out = bytearray()
        while True:
            chunk = self.read(timeout)
            if not chunk:
                break
            out += chunk
        ex = self._exit or {}
        return ExecResult(
            exec_id=self.exec_id,
            stdout=bytes(out),
            stderr=b"",
            exit_code=int(ex.get("code", -1)),
            signal=int(ex.get("signal", 0)),
            timed_out=bool(ex.get("timeout", False)),
            truncated=bool(ex.get("truncated", False)),
            duration_ms=int(ex.get("duration_ms", 0)),
            oom_killed=bool(ex.get("oom_killed", False)),
        )

    def close(self) -> None:
        """Close the socket: the command is killed unless it was opened with
        ``keep=True``."""
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing a broken socket
            pass


def open_terminal(
    client: "Client",
    sandbox_id: str,
    path: str,
    query: Mapping[str, Any],
    timeout: float | None,
) -> Terminal:
    """Open the terminal WebSocket at ``path`` with ``query``."""
    ws = _websocket()
    q = urllib.parse.urlencode([(k, v) for k, vs in query.items() for v in (vs if isinstance(vs, list) else [vs]) if v is not None])
    scheme = "wss" if client._https else "ws"
    netloc = client._host if client._port is None else f"{client._host}:{client._port}"
    if ":" in client._host and not client._host.startswith("["):
        netloc = f"[{client._host}]" + ("" if client._port is None else f":{client._port}")
    url = f"{scheme}://{netloc}{client._url(path)}" + (f"?{q}" if q else "")
    headers = [f"User-Agent: {client.user_agent}"]
    if client.api_key:
        headers.append(f"Authorization: Bearer {client.api_key}")
    sslopt = {"cert_reqs": ssl.CERT_REQUIRED} if client._https else None
    try:
        conn = ws.create_connection(url, header=headers, timeout=timeout, sslopt=sslopt, enable_multithread=True)
    except ws.WebSocketBadStatusException as e:
        body = getattr(e, "resp_body", None) or b""
        if isinstance(body, str):
            body = body.encode()
        raise error_from_response(getattr(e, "status_code", 0) or 0, body, None) from e
    return Terminal(conn, sandbox_id)
