"""The airlock HTTP API client (standard library only)."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import posixpath
import tarfile
import tempfile
import urllib.parse
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from ._code import Execution, Result, ndjson_records, read_code_stream
from ._errors import AirlockError, ExecPaused, StreamBroken, error_from_response

if TYPE_CHECKING:  # pragma: no cover
    from ._terminal import Terminal

__version__ = "0.1.0"

_CHUNK = 64 * 1024
_MAX_ERROR_BODY = 64 * 1024

OutputCallback = Callable[[bytes], None]


@dataclasses.dataclass
class ExecResult:
    """How an exec ended, with its output.

    stdout/stderr hold the collected output, or b"" for a stream that went to
    an on_stdout/on_stderr callback instead. exit_code is -1 when the command
    was killed by a signal (then ``signal`` is its number); ``oom_killed`` says
    the guest kernel's OOM killer killed a process of the command.
    """

    exec_id: str | None
    stdout: bytes
    stderr: bytes
    exit_code: int
    signal: int = 0
    timed_out: bool = False
    truncated: bool = False
    duration_ms: int = 0
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0


class FileList(list):
    """The entries of a directory listing (FileInfo dicts); ``truncated`` is
    True when the server capped the listing."""

    truncated: bool = False


class Client:
    """A client for one airlock API server.

    ``base_url`` defaults to $AIRLOCK_HOST and ``api_key`` to $AIRLOCK_API_KEY.
    ``timeout`` (seconds, None for none) bounds connecting and each socket
    operation, file transfers included (per read or write, not in total);
    exec streams wait as long as the command runs. Every call opens its own connection, so a Client may be
    shared between threads.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = 60.0,
        user_agent: str | None = None,
    ):
        base_url = base_url or os.environ.get("AIRLOCK_HOST")
        if not base_url:
            raise ValueError("airlock: no base_url given and AIRLOCK_HOST is not set")
        if "://" not in base_url:
            base_url = "http://" + base_url
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"airlock: bad base_url {base_url!r}")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("AIRLOCK_API_KEY", "")
        self.timeout = timeout
        self.user_agent = user_agent or f"airlock-python/{__version__}"

    # -- transport -----------------------------------------------------------

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout, blocksize=_CHUNK)

    def _url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        url = self._prefix + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                url += "?" + urllib.parse.urlencode(q, doseq=True)
        return url

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        ok: Iterable[int] = (200,),
        timeout: float | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request; return the open connection and its response if the
        status is in ok, else raise the decoded AirlockError. The caller closes
        the connection."""
        h = {"User-Agent": self.user_agent}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(headers or {})
        conn = self._connect(self.timeout)
        try:
            conn.connect()  # under the client's timeout; then the call's own
            conn.sock.settimeout(timeout)
            try:
                conn.request(method, self._url(path, query), body=body, headers=h)
            except (BrokenPipeError, ConnectionResetError):
                # The server answered (an error, typically) before reading the
                # whole body: report its answer rather than the broken pipe.
                pass
            resp = conn.getresponse()
            if resp.status not in tuple(ok):
                data = resp.read(_MAX_ERROR_BODY)
                raise error_from_response(resp.status, data, resp.getheader("X-Request-Id"))
            return conn, resp
        except BaseException:
            conn.close()
            raise

    def _json(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        ok: Iterable[int] = (200,),
    ) -> Any:
        body, headers = None, {"Accept": "application/json"}
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        conn, resp = self._open(method, path, query=query, body=body, headers=headers, ok=ok, timeout=self.timeout)
        try:
            data = resp.read()
        finally:
            conn.close()
        if not data.strip():
            return None
        return json.loads(data)

    # -- sandboxes -----------------------------------------------------------

    def create(
        self,
        image: str | None = None,
        cpus: int | None = None,
        memory_mb: int | None = None,
        timeout_s: int = 900,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        *,
        disk_mb: int = 0,
        network: str | Mapping[str, Any] | None = None,
        idle_pause_s: int = 0,
        from_snapshot: str | None = None,
        volumes: Iterable[Mapping[str, Any]] | None = None,
        mounts: Iterable[Mapping[str, Any]] | None = None,
    ) -> "Sandbox":
        """Start a sandbox. Use it as a context manager to kill it on exit:
        ``with client.create() as sb: ...``.

        ``network`` is None (the server's default: the public internet), a
        mode ("public", "deny" or "none"), or a dict with the API's fields::

            network={
                "mode": "deny",                       # default: public, or deny with allow
                "allow": ["api.github.com", "140.82.112.0/20:443"],
                "secrets": [{"name": "OPENAI_API_KEY", "hosts": ["api.openai.com"],
                             "value": os.environ["OPENAI_API_KEY"],
                             "header": "Authorization"}],   # optional: this header only
                "ports": [{"host_ip": "127.0.0.1", "host_port": 8080, "guest_port": 8000}],  # admin keys only
                "rate_bytes": 1 << 20,                # bytes/s each way; 0: unlimited
                "max_conns": 256,
            }

        The guest sees a placeholder in $OPENAI_API_KEY; the server puts the
        real value into requests to the secret's hosts only (HTTP/1.1,
        HTTP/2, WebSocket handshakes), with ``header`` into that request
        header only, and never returns it (``sb.network`` shows names,
        hosts, headers and placeholders).

        ``idle_pause_s`` pauses the sandbox after that many idle seconds (no
        exec or code running, no API call on it, no inbound connection); the
        next call resumes it. 0 (the default): never. Not allowed together
        with secrets. ``timeout_s`` counts running time only.

        Defaults: image "base", 1 CPU, 512 MiB, the server's default disk.
        ``from_snapshot`` starts the sandbox from that snapshot of your
        tenant (see ``snapshot``): processes, memory and disk as saved. Its
        image, size, env and network are the snapshot's: leave image, cpus,
        memory_mb, disk_mb, env and network unset.

        ``volumes`` mounts your tenant's volumes (see ``create_volume``) for
        the sandbox's life, and ``mounts`` host directories (read-only unless
        ``"read_only": False``), at most 4 in all::

            volumes=[{"name": "data", "path": "/data"},                   # read-write
                     {"name": "models", "path": "/models", "read_only": True}],
            mounts=[{"host_path": "/srv/datasets", "path": "/datasets"}],  # read-only
                   # unless "read_only": False

        A volume is mounted read-write by one sandbox at a time, or
        read-only by any number (Conflict otherwise). Host directories are
        read-only unless ``"read_only": False``; an API key may mount only
        under the directories the server allows (PermissionDenied).
        """
        payload: dict[str, Any] = {"timeout_s": timeout_s}
        if from_snapshot:
            payload["from_snapshot"] = from_snapshot
        else:
            image, cpus, memory_mb = image or "base", cpus or 1, memory_mb or 512
        for k, v in (("image", image), ("cpus", cpus), ("memory_mb", memory_mb), ("disk_mb", disk_mb)):
            if v:
                payload[k] = v
        if network is not None:
            payload["network"] = network if isinstance(network, str) else dict(network)
        if idle_pause_s:
            payload["idle_pause_s"] = int(idle_pause_s)
        if env:
            payload["env"] = dict(env)
        if metadata:
            payload["metadata"] = dict(metadata)
        if volumes:
            payload["volumes"] = [dict(v) for v in volumes]
        if mounts:
            payload["mounts"] = [dict(m) for m in mounts]
        return Sandbox(self, self._json("POST", "/v1/sandboxes", payload, ok=(201, 200)))

    def get(self, sandbox_id: str) -> "Sandbox":
        """Return sandbox ``sandbox_id`` (NotFound if missing or not yours)."""
        return Sandbox(self, self._json("GET", _sb(sandbox_id)))

    def list(self, state: str | None = None, metadata: Mapping[str, str] | None = None) -> list["Sandbox"]:
        """Sandboxes visible to this key, filtered by state and metadata pairs."""
        q: dict[str, Any] = {"state": state}
        for k, v in (metadata or {}).items():
            q[f"metadata.{k}"] = v
        out = self._json("GET", "/v1/sandboxes", query=q)
        return [Sandbox(self, s) for s in out.get("sandboxes") or []]

    def kill(self, sandbox_id: str) -> None:
        """Stop and delete sandbox ``sandbox_id``."""
        self._json("DELETE", _sb(sandbox_id), ok=(204, 200))

    def pause(self, sandbox_id: str, force: bool = False) -> "Sandbox":
        """Pause sandbox ``sandbox_id``: its memory, devices and disk are saved
        on the server's disk and its RAM is freed (state "paused"); its
        lifetime stands still. Any later call on it resumes it with every
        process as it was; the guest's open TCP connections are reset.
        Running commands are parked and go on after the resume (their
        streams raise ExecPaused). Raises FailedPrecondition while code or transfers run,
        unless ``force`` (which ends them). A sandbox with secrets binds
        them again at the resume.
        Pausing a paused sandbox does nothing. The returned sandbox's
        ``info["pause"]`` says what was saved: ``{"state_bytes", "save_ms"}``."""
        return Sandbox(self, self._json("POST", _sb(sandbox_id, "pause"), {"force": bool(force)}))

    def resume(self, sandbox_id: str) -> "Sandbox":
        """Resume paused sandbox ``sandbox_id`` (a running one is left as it
        is). Any other call on a paused sandbox resumes it too."""
        return Sandbox(self, self._json("POST", _sb(sandbox_id, "resume")))

    def keepalive(self, sandbox_id: str) -> None:
        """Count as activity on ``sandbox_id`` for its idle pause (see
        ``create(idle_pause_s=...)``); like any call, resumes it if paused."""
        self._json("POST", _sb(sandbox_id, "keepalive"), ok=(204, 200))

    def get_network(self, sandbox_id: str) -> dict:
        """Sandbox ``sandbox_id``'s network, as ``Sandbox.network`` has it:
        ``{"mode", "allow", "secrets", "ports", "rate_bytes", "max_conns"}``
        (secrets by name and placeholder, never values). Never resumes a
        paused sandbox."""
        return self._json("GET", _sb(sandbox_id, "network"))["network"]

    def set_network(self, sandbox_id: str, mode: str | None = None, allow: Sequence[str] | None = None) -> dict:
        """Replace sandbox ``sandbox_id``'s egress policy, whole: ``mode``
        ``"public"`` or ``"deny"`` (default: deny when ``allow`` is given,
        else public) and ``allow`` rules (the syntax of ``create``'s); every
        rule not given is removed, secrets, ports and limits stay. A running
        sandbox enforces it at once and closes the open connections it
        forbids; a paused one gets it when it resumes. Returns ``{"network",
        "closed", "applied"}`` (``applied``: ``"running"`` or ``"resume"``).
        Raises InvalidRequest for a bad rule or a change into or out of mode
        ``"none"``, PermissionDenied for a rule that opens private,
        loopback, link-local or metadata addresses without an admin key."""
        body: dict[str, Any] = {}
        if mode:
            body["mode"] = mode
        if allow:
            body["allow"] = list(allow)
        return self._json("PUT", _sb(sandbox_id, "network"), body)

    def usage(self, sandbox_id: str) -> dict:
        """One sample of running sandbox ``sandbox_id``'s resource use:
        ``{"sandbox_id", "sampled_at", "cpus", "cpu_seconds", "memory_bytes",
        "memory_limit_bytes", "disk_bytes", "disk_limit_bytes"}`` and, when it
        has a network, ``"network": {"receive_bytes", "transmit_bytes",
        "connections"}``. Rates are deltas between two samples over their
        ``sampled_at``. Never resumes a paused sandbox (FailedPrecondition
        unless running) and is not activity for the idle pause."""
        return self._json("GET", _sb(sandbox_id, "usage"))

    # -- snapshots and forks ---------------------------------------------------

    def snapshot(self, sandbox_id: str, name: str, force: bool = False) -> dict:
        """Save running (or paused) sandbox ``sandbox_id`` as the snapshot
        ``name`` of its tenant; the sandbox keeps running (it is saved while
        it runs: its guest stops only while its memory is written out, and
        keeps its open TCP connections). Names: 1-63 letters, digits, ".", "_" or
        "-", starting with a letter or digit. Returns the snapshot (name,
        id, sandbox_id, image, cpus, memory_mb, disk_mb, size_bytes,
        created_at). Raises Conflict if the name is taken, and
        FailedPrecondition for sandboxes with secrets or, unless ``force``
        (which ends them), with commands or code running."""
        return self._json("POST", _sb(sandbox_id, "snapshot"), {"name": name, "force": bool(force)}, ok=(201, 200))

    def start_browser(self, sandbox_id: str, interactive: bool = False, signed_ttl_s: int = 0, view: bool = False) -> dict:
        """Start the Chromium of sandbox ``sandbox_id`` (made from the browser
        image, ``airlock image build browser``) if it is not running, and say
        where to reach it: ``cdp_url`` (the DevTools WebSocket; send the key
        as ``Authorization: Bearer``), ``cdp_http_url`` (for Playwright's
        ``connect_over_cdp``), ``signed_cdp_url`` (a token instead of the
        key, until ``signed_expires_at``; ``signed_ttl_s`` up to 3600),
        ``vnc_url`` and, with a preview domain, ``view_url`` (the live view).
        With ``view`` the answer waits for the live view too; with
        ``interactive`` the live view takes keyboard and mouse. Raises
        FailedPrecondition when the sandbox's image has no browser."""
        body = {"interactive": bool(interactive), "view": bool(view)}
        if signed_ttl_s:
            body["ttl_s"] = int(signed_ttl_s)
        return self._json("POST", _sb(sandbox_id, "browser"), body)

    def browser_status(self, sandbox_id: str) -> dict:
        """The sandbox's Chromium: ``running`` and, while it runs, its URLs
        (never a signed one). Starts nothing."""
        return self._json("GET", _sb(sandbox_id, "browser"))

    def list_snapshots(self) -> list[dict]:
        """Your tenant's snapshots."""
        return self._json("GET", "/v1/snapshots").get("snapshots") or []

    def get_snapshot(self, name: str) -> dict:
        """Snapshot ``name`` (NotFound if your tenant has none of that name)."""
        return self._json("GET", "/v1/snapshots/" + urllib.parse.quote(name, safe=""))

    def delete_snapshot(self, name: str) -> None:
        """Delete snapshot ``name`` and free its disk. Raises
        FailedPrecondition while sandboxes made from it (or forked, or
        snapshots of them) exist: its disk backs theirs."""
        self._json("DELETE", "/v1/snapshots/" + urllib.parse.quote(name, safe=""), ok=(204, 200))

    def prune_snapshots(self) -> int:
        """Remove the snapshots forks started from once unused, and orphaned
        snapshot files; returns the bytes freed. Admin keys only
        (PermissionDenied otherwise)."""
        return int(self._json("POST", "/v1/snapshots/prune").get("freed_bytes", 0))

    def fork(self, sandbox_id: str, count: int = 1, force: bool = False, secrets: bool = False) -> list["Sandbox"]:
        """Make ``count`` (1-16) running copies of sandbox ``sandbox_id``: its
        processes, memory and disk, each with a fresh clock, RNG reseed and
        its own network stack. The source is saved while it runs (as for
        ``snapshot``). Forks count against your quotas like creates; kill
        them when done. All or nothing: on an error no fork is left. With
        ``secrets`` each fork binds the source's secret values (without, its
        guest holds placeholders that reach no one)."""
        body = {"count": int(count), "force": bool(force)}
        if secrets:
            body["secrets"] = True
        out = self._json("POST", _sb(sandbox_id, "fork"), body, ok=(201, 200))
        return [Sandbox(self, s) for s in out.get("sandboxes") or []]

    # -- volumes -------------------------------------------------------------

    def create_volume(self, name: str, size_mb: int) -> dict:
        """Create volume ``name``, an empty filesystem of ``size_mb`` MiB (at
        least 16) that outlives sandboxes; mount it with ``create(volumes=...)``.
        Names: 1-63 lowercase letters, digits, ".", "_" or "-", starting with
        a letter or digit. Returns the volume (name, id, tenant, size_mb,
        allocated_bytes, created_at, guest_written, attachments). Raises
        Conflict if the name is taken and QuotaExceeded over max_volumes or
        max_disk_mb (a volume's full size counts)."""
        return self._json("POST", "/v1/volumes", {"name": name, "size_mb": int(size_mb)}, ok=(201, 200))

    def list_volumes(self) -> list[dict]:
        """Your tenant's volumes."""
        return self._json("GET", "/v1/volumes").get("volumes") or []

    def get_volume(self, name: str) -> dict:
        """Volume ``name`` with its ``attachments`` (the sandboxes that mount
        it: sandbox_id, path, read_only); NotFound if your tenant has none
        of that name."""
        return self._json("GET", _vol(name))

    def resize_volume(self, name: str, size_mb: int) -> dict:
        """Grow volume ``name`` to ``size_mb`` MiB (never shrink:
        InvalidRequest); its filesystem grows when a sandbox next mounts it.
        Raises Conflict while a sandbox has it mounted."""
        return self._json("POST", _vol(name) + "/resize", {"size_mb": int(size_mb)})

    def delete_volume(self, name: str) -> None:
        """Delete volume ``name`` and its data. Raises Conflict while a
        sandbox (in any state) has it mounted."""
        self._json("DELETE", _vol(name), ok=(204, 200))

    # -- templates --------------------------------------------------------------

    def build_template(
        self,
        name: str,
        context_dir: str | os.PathLike,
        *,
        dockerfile: str | os.PathLike | None = None,
        start: str | None = None,
        ready: str | None = None,
        ready_timeout: float | None = None,
        build_args: Mapping[str, str] | None = None,
        cpus: int | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        no_cache: bool = False,
        on_event: Callable[[dict], None] | None = None,
    ) -> dict:
        """Build (or rebuild) template ``name`` from the Dockerfile in
        ``context_dir`` (or ``dockerfile``, which may be outside it) on the
        server: the steps run in a sandbox of your tenant, each saved for
        later builds; then ``start`` (default: the Dockerfile's ENTRYPOINT and
        CMD) runs in the background and ``ready`` is retried until it exits
        0, and the running sandbox is saved. ``create(image=name)`` starts a
        clone of it. ``on_event`` gets each progress record (kind "step",
        "cached", "config", "output", "done", "status"). Returns the template;
        raises InvalidRequest for a bad Dockerfile (naming its line) and
        FailedPrecondition when a step or the ready check fails (the message
        has the line, exit code and output)."""
        q: dict[str, Any] = {}
        for k, v in (("start", start), ("ready", ready)):
            if v:
                q[k] = v
        if ready_timeout:
            q["ready_timeout_s"] = int(-(-ready_timeout // 1))
        for k, v in (("cpus", cpus), ("memory_mb", memory_mb), ("disk_mb", disk_mb)):
            if v:
                q[k] = int(v)
        if no_cache:
            q["no_cache"] = "true"
        if build_args:
            q["build_arg"] = [f"{k}={v}" for k, v in build_args.items()]
        ctx = os.path.abspath(context_dir)
        df = os.path.abspath(dockerfile) if dockerfile else os.path.join(ctx, "Dockerfile")
        outside = os.path.commonpath([ctx, df]) != ctx
        if not outside:
            q["dockerfile"] = os.path.relpath(df, ctx).replace(os.sep, "/")

        def regular(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return ti if ti.isreg() or ti.isdir() or ti.issym() or ti.islnk() else None

        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
                if outside:
                    tar.add(df, arcname=".airlock-dockerfile", filter=regular)
                for entry in sorted(os.listdir(ctx)):
                    tar.add(os.path.join(ctx, entry), arcname=entry, filter=regular)
            size = tmp.tell()
            tmp.seek(0)
            conn, resp = self._open(
                "POST",
                "/v1/templates/" + urllib.parse.quote(name, safe="") + "/build",
                query=q,
                body=tmp,
                headers={"Content-Type": "application/x-tar", "Content-Length": str(size), "Accept": "application/x-ndjson"},
                timeout=None,
            )
            try:
                for rec in ndjson_records(resp, lambda: None, "built"):
                    kind = rec.get("kind")
                    if kind == "built":
                        return rec.get("template") or {}
                    if kind == "error":
                        status = {"invalid": 400, "not_found": 404, "resource_exhausted": 429}.get(rec.get("code", ""), 412)
                        raise error_from_response(status, json.dumps({"error": {"code": rec.get("code") or "failed_precondition", "message": rec.get("message", "")}}).encode(), None)
                    if on_event:
                        on_event(rec)
            finally:
                conn.close()
        raise AirlockError(0, "internal", "the build stream ended without a result")  # pragma: no cover

    def list_templates(self) -> list[dict]:
        """Your tenant's templates."""
        return self._json("GET", "/v1/templates").get("templates") or []

    def get_template(self, name: str) -> dict:
        """Template ``name`` (env, workdir, user, cmd, entrypoint,
        exposed_ports, labels, start, ready); NotFound if your tenant has
        none of that name."""
        return self._json("GET", "/v1/templates/" + urllib.parse.quote(name, safe=""))

    def template_log(self, name: str) -> str:
        """The log of your tenant's last build of ``name`` (failed builds
        too); NotFound if there is none."""
        conn, resp = self._open(
            "GET", "/v1/templates/" + urllib.parse.quote(name, safe="") + "/log",
            headers={"Accept": "text/plain"}, timeout=self.timeout,
        )
        try:
            return resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def delete_template(self, name: str) -> None:
        """Remove template ``name``; sandboxes running from it go on."""
        self._json("DELETE", "/v1/templates/" + urllib.parse.quote(name, safe=""), ok=(204, 200))

    def prune_templates(self) -> int:
        """Free your tenant's build cache (saved steps) and unused saved
        states of replaced templates; returns how many were removed."""
        return int(self._json("POST", "/v1/templates/prune").get("removed", 0))

    # -- the vault and live secrets -------------------------------------------

    def set_vault_secret(self, name: str, value: str, hosts: Sequence[str] | None = None) -> dict:
        """Store ``value`` as your tenant's vault secret ``name`` (replacing
        one of that name), for ``hosts`` (names or ``*.suffix``; none: each
        sandbox names them). The server seals it at rest and never returns
        it. Sandboxes reference it by name: ``{"name": ..., "vault": name}``
        in ``create(network={"secrets": [...]})`` or
        ``set_sandbox_secret(..., vault=name)``. Returns ``{"name",
        "hosts", "created_at", "updated_at"}``. Raises InvalidRequest for a
        bad name, host or value (at most 16 KiB, no CR, LF or NUL) and
        QuotaExceeded when the vault is full."""
        body: dict[str, Any] = {"value": value}
        if hosts:
            body["hosts"] = list(hosts)
        return self._json("PUT", _secret(name), body)

    def list_vault_secrets(self) -> list[dict]:
        """Your tenant's vault secrets: names, hosts and times, never values."""
        return self._json("GET", "/v1/secrets").get("secrets") or []

    def delete_vault_secret(self, name: str) -> None:
        """Remove vault secret ``name`` (NotFound if none). Sandboxes that
        were given its value keep it."""
        self._json("DELETE", _secret(name), ok=(204, 200))

    def set_sandbox_secret(
        self,
        sandbox_id: str,
        name: str,
        *,
        value: str | None = None,
        vault: str | None = None,
        hosts: Sequence[str] | None = None,
        header: str | None = None,
    ) -> dict:
        """Give running or paused sandbox ``sandbox_id`` the secret ``name``
        (or replace its secret of that name) now: ``value`` with ``hosts``,
        or ``vault`` naming a vault secret (``hosts`` then default to its);
        with ``header``, the value goes into that request header only.
        New commands see the placeholder in ``$name``; the host injects the
        value into new requests to the hosts at once; a paused sandbox gets
        it when it resumes. Returns ``{"network", "closed", "applied"}``."""
        if (value is None) == (vault is None):
            raise ValueError("give value or vault, not both")
        body: dict[str, Any] = {}
        if hosts:
            body["hosts"] = list(hosts)
        if header:
            body["header"] = header
        if value is not None:
            body["value"] = value
        if vault is not None:
            body["vault"] = vault
        return self._json("PUT", _sb(sandbox_id, "secrets", name), body)

    def remove_sandbox_secret(self, sandbox_id: str, name: str) -> dict:
        """Remove secret ``name`` from running or paused sandbox
        ``sandbox_id`` now: no request gets its value from then on (open
        connections that did are closed). Returns ``{"network", "closed",
        "applied"}``; NotFound for a secret it does not have."""
        return self._json("DELETE", _sb(sandbox_id, "secrets", name))

    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle on ``sandbox_id`` without fetching it (``info`` holds only the id)."""
        return Sandbox(self, {"id": sandbox_id})

    def events(
        self,
        sandbox: str | None = None,
        since: int = 0,
        limit: int | None = None,
        type: str | None = None,  # noqa: A002 (the API's name)
    ) -> tuple[list[dict], int]:
        """Audit events after sequence number ``since``; returns (events, next),
        where next is the ``since`` to pass next time. ``type`` selects actions
        equal to it or starting with it plus "." (``type="net"``: every network
        decision: net.allow, net.deny, net.secret.inject, ...)."""
        q = {"sandbox": sandbox, "type": type or None, "since": since or None, "limit": limit}
        out = self._json("GET", "/v1/events", query=q)
        return out.get("events") or [], int(out.get("next", since))

    def port_url(self, sandbox_id: str, port: int) -> str:
        """The preview URL of TCP ``port`` in the sandbox: the server proxies
        HTTP under it to the guest's port (path and query after it pass
        through). Requests need ``Authorization: Bearer <api key>``; the
        guest never sees the key."""
        scheme = "https" if self._https else "http"
        host = self._host if ":" not in self._host else f"[{self._host}]"
        netloc = host if self._port is None else f"{host}:{self._port}"
        return f"{scheme}://{netloc}{self._prefix}{_sb(sandbox_id, 'ports', str(int(port)))}/"

    def server(self) -> dict:
        """The server as this key may see it (what the dashboard's Server page
        shows): ``{"admin", "sandboxes": {state: count}, "activity": {"since",
        "bucket_s", "creates", "failures"}, "tenants": [{"tenant", "sandboxes",
        "vcpus", "memory_mb", "disk_mb", "snapshots", "snapshots_disk_mb", "volumes", "volumes_disk_mb",
        "quota"}], "runtime": {"name"}}``. A tenant key gets its own tenant
        only; an admin key every tenant, ``"host"`` (disk and memory) and the
        runtime's ``"why"``."""
        return self._json("GET", "/v1/server")

    def healthz(self) -> bool:
        """True if the server answers /healthz with ok."""
        out = self._json("GET", "/healthz")
        return bool(out and out.get("ok"))


def _rebased(tar: tarfile.TarFile, base: str):
    """The members of a sandbox's archive of ``base``, renamed relative to it
    (the entry for ``base`` itself is left out); a member elsewhere raises."""
    prefix = base + "/"
    for m in tar:
        name = m.name.rstrip("/")
        if name == base:
            continue
        if not name.startswith(prefix):
            raise tarfile.OutsideDestinationError(m, name)
        m.name = name[len(prefix):]
        if m.islnk():
            if not m.linkname.startswith(prefix):
                raise tarfile.LinkOutsideDestinationError(m, m.linkname)
            m.linkname = m.linkname[len(prefix):]
        yield m


def _sb(sandbox_id: str, *rest: str) -> str:
    p = "/v1/sandboxes/" + urllib.parse.quote(sandbox_id, safe="")
    for r in rest:
        p += "/" + urllib.parse.quote(r, safe="")
    return p


def _vol(name: str) -> str:
    return "/v1/volumes/" + urllib.parse.quote(name, safe="")


def _secret(name: str) -> str:
    return "/v1/secrets/" + urllib.parse.quote(name, safe="")


def _cmd(cmd: str | list[str]) -> list[str]:
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    return list(cmd)


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


class Sandbox:
    """A sandbox on the server. ``info`` is the server's last answer about it
    (a dict: id, state, image, cpus, memory_mb, expires_at, metadata, ...)."""

    def __init__(self, client: Client, info: dict):
        self._client = client
        self.info = info

    @property
    def id(self) -> str:
        return self.info["id"]

    @property
    def state(self) -> str | None:
        return self.info.get("state")

    @property
    def network(self) -> dict:
        """The network as the server reports it (mode, allow, secrets with
        name, hosts and placeholder but never a value, ports, limits)."""
        return self.info.get("network") or {}

    @property
    def mounts(self) -> list[dict]:
        """Its volumes and host directories as the server reports them:
        ``[{"volume" or "host_path", "path", "read_only"}]``."""
        return self.info.get("mounts") or []

    def port_url(self, port: int) -> str:
        """The preview URL of TCP ``port`` in this sandbox (see Client.port_url)."""
        return self._client.port_url(self.id, port)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self.state!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
        except AirlockError as e:
            if e.code != "not_found":
                raise

    # -- lifecycle -----------------------------------------------------------

    def refresh(self) -> "Sandbox":
        """Fetch the sandbox again into ``info``."""
        self.info = self._client._json("GET", _sb(self.id))
        return self

    def set_timeout(self, timeout_s: int) -> "Sandbox":
        """Make the sandbox expire ``timeout_s`` seconds from now."""
        self.info = self._client._json("POST", _sb(self.id, "timeout"), {"timeout_s": int(timeout_s)})
        return self

    def kill(self) -> None:
        """Stop and delete the sandbox."""
        self._client.kill(self.id)

    def pause(self, force: bool = False) -> "Sandbox":
        """Pause the sandbox (see Client.pause); ``info["pause"]`` then says
        what was saved."""
        self.info = self._client.pause(self.id, force).info
        return self

    def snapshot(self, name: str, force: bool = False) -> dict:
        """Save this sandbox as snapshot ``name`` (see Client.snapshot); it keeps running."""
        return self._client.snapshot(self.id, name, force)

    def start_browser(self, interactive: bool = False, signed_ttl_s: int = 0) -> dict:
        """Start this sandbox's Chromium (see Client.start_browser)."""
        return self._client.start_browser(self.id, interactive, signed_ttl_s)

    def browser_status(self) -> dict:
        """This sandbox's Chromium (see Client.browser_status)."""
        return self._client.browser_status(self.id)

    def fork(self, count: int = 1, force: bool = False, secrets: bool = False) -> list["Sandbox"]:
        """``count`` running copies of this sandbox (see Client.fork)."""
        return self._client.fork(self.id, count, force, secrets)

    def resume(self) -> "Sandbox":
        """Resume the sandbox if paused (any other call does it too)."""
        self.info = self._client.resume(self.id).info
        return self

    def keepalive(self) -> None:
        """Count as activity for the idle pause (resumes it if paused)."""
        self._client.keepalive(self.id)

    def usage(self) -> dict:
        """One sample of the sandbox's resource use (see Client.usage); never
        resumes it."""
        return self._client.usage(self.id)

    def set_network(self, mode: str | None = None, allow: Sequence[str] | None = None) -> dict:
        """Replace the sandbox's egress policy, whole (see
        Client.set_network); ``info["network"]`` is updated."""
        out = self._client.set_network(self.id, mode, allow)
        self.info["network"] = out["network"]
        return out

    def set_secret(
        self,
        name: str,
        *,
        value: str | None = None,
        vault: str | None = None,
        hosts: Sequence[str] | None = None,
        header: str | None = None,
    ) -> dict:
        """Add or replace a secret now (see Client.set_sandbox_secret);
        ``info["network"]`` is updated."""
        out = self._client.set_sandbox_secret(self.id, name, value=value, vault=vault, hosts=hosts, header=header)
        self.info["network"] = out["network"]
        return out

    def remove_secret(self, name: str) -> dict:
        """Remove a secret now (see Client.remove_sandbox_secret);
        ``info["network"]`` is updated."""
        out = self._client.remove_sandbox_secret(self.id, name)
        self.info["network"] = out["network"]
        return out

    def logs(self, tail_bytes: int | None = None) -> list[dict]:
        """The end of each of the sandbox's logs this key may read, as dicts
        ``{"source", "exists", "size", "truncated", "text"}``: ``"console"``
        (the guest's console) and, for an admin key, ``"supervisor"``
        (its shim's log on the host). ``tail_bytes`` (1..1 MiB, default 64
        KiB on the server) bounds each. Never resumes the sandbox."""
        out = self._client._json("GET", _sb(self.id, "logs"), query={"tail_bytes": tail_bytes})
        return list(out.get("logs") or [])

    # -- exec ----------------------------------------------------------------

    def _exec_payload(self, cmd, env, cwd, user, stdin, stdin_open, timeout_s, background, kill_on_disconnect, pids_limit):
        p: dict[str, Any] = {"cmd": _cmd(cmd), "background": background}
        if env:
            p["env"] = dict(env)
        if cwd:
            p["cwd"] = cwd
        if user:
            p["user"] = user
        if stdin is not None:
            p["stdin"] = base64.b64encode(_bytes(stdin)).decode()
        if stdin_open:
            p["stdin_open"] = True
        if timeout_s:
            p["timeout_s"] = int(timeout_s)
        if kill_on_disconnect:
            p["kill_on_disconnect"] = True
        if pids_limit:
            p["pids_limit"] = int(pids_limit)
        return p

    def exec(
        self,
        cmd: str | list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: bytes | str | None = None,
        timeout_s: int | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        kill_on_disconnect: bool = False,
        pids_limit: int = 0,
    ) -> ExecResult:
        """Run ``cmd`` (an argv list, or a string run with ``sh -c``) and wait
        for it. Output is collected into the result, or passed chunk by chunk
        to on_stdout/on_stderr as it arrives. ``stdin`` is the whole stdin.
        ``pids_limit`` caps the command's processes and threads (0: the
        guest's default, 1024 in a microVM; under gVisor half the sandbox's
        task budget). Raises StreamBroken if the stream ends before the
        command does."""
        payload = self._exec_payload(cmd, env, cwd, user, stdin, False, timeout_s, False, kill_on_disconnect, pids_limit)
        conn, resp = self._client._open(
            "POST",
            _sb(self.id, "exec"),
            query={"encoding": "base64"},
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/x-ndjson"},
            timeout=None,
        )
        try:
            return _read_stream(resp, None, on_stdout, on_stderr)
        finally:
            conn.close()

    def start(
        self,
        cmd: str | list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: bytes | str | None = None,
        stdin_open: bool = False,
        timeout_s: int | None = None,
        pids_limit: int = 0,
    ) -> str:
        """Start ``cmd`` in the background and return its exec id (for attach,
        send_stdin, signal, get_exec). ``stdin_open`` keeps stdin open for
        send_stdin; ``pids_limit`` is as for exec."""
        payload = self._exec_payload(cmd, env, cwd, user, stdin, stdin_open, timeout_s, True, False, pids_limit)
        out = self._client._json("POST", _sb(self.id, "exec"), payload, query={"encoding": "base64"}, ok=(202, 200))
        return out["exec_id"]

    def attach(
        self,
        exec_id: str,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Follow exec ``exec_id`` from the start of its retained output until
        it exits (at once if it already has)."""
        conn, resp = self._client._open(
            "GET",
            _sb(self.id, "execs", exec_id, "stream"),
            query={"encoding": "base64"},
            headers={"Accept": "application/x-ndjson"},
            timeout=None,
        )
        try:
            return _read_stream(resp, exec_id, on_stdout, on_stderr)
        finally:
            conn.close()

    def terminal(
        self,
        cmd: str | list[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout_s: int | None = None,
        keep: bool = False,
        exec_id: str | None = None,
    ) -> "Terminal":
        """Run ``cmd`` (default: a login shell) on a terminal of ``rows`` x
        ``cols`` in the guest and return the open Terminal (send, read,
        resize, signal, wait, close). With ``keep`` the command survives the
        Terminal's close; ``exec_id`` re-attaches to such a running terminal
        (its retained output first) instead of starting one. Needs the
        websocket-client package (python3-websocket)."""
        from ._terminal import open_terminal

        query: dict[str, Any] = {}
        if exec_id:
            query["exec_id"] = exec_id
        else:
            query.update({"rows": rows, "cols": cols, "cwd": cwd, "user": user, "timeout_s": timeout_s})
            if cmd is not None:
                query["cmd"] = _cmd(cmd)
            if env:
                query["env"] = [f"{k}={v}" for k, v in env.items()]
            if keep:
                query["keep"] = "true"
        return open_terminal(self._client, self.id, _sb(self.id, "pty"), query, self._client.timeout)

    def list_execs(self) -> list[dict]:
        """The sandbox's execs (dicts: exec_id, cmd, pid, state, exit, ...)."""
        return self._client._json("GET", _sb(self.id, "execs")).get("execs") or []

    def get_exec(self, exec_id: str) -> dict:
        """One exec (exit is None while it runs)."""
        return self._client._json("GET", _sb(self.id, "execs", exec_id))

    def send_stdin(self, exec_id: str, data: bytes | str, close: bool = False) -> None:
        """Write to a background exec's stdin (started with stdin_open=True);
        ``close`` closes it afterwards."""
        conn, resp = self._client._open(
            "POST",
            _sb(self.id, "execs", exec_id, "stdin"),
            query={"close": "true"} if close else None,
            body=_bytes(data),
            headers={"Content-Type": "application/octet-stream"},
            ok=(204, 200),
            timeout=self._client.timeout,
        )
        try:
            resp.read()
        finally:
            conn.close()

    def signal(self, exec_id: str, sig: int) -> None:
        """Send signal number ``sig`` (e.g. 15) to an exec."""
        self._client._json("POST", _sb(self.id, "execs", exec_id, "signal"), {"signal": int(sig)}, ok=(204, 200))

    # -- files ---------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str | IO[bytes] | Iterable[bytes], mode: int | None = None) -> int:
        """Write ``data`` (bytes, str, a binary file object or an iterable of
        bytes) to ``path``, replacing it; returns the size stored. File objects
        and iterables are streamed with chunked transfer encoding, never read
        whole into memory. ``mode`` sets permission bits (e.g. 0o755)."""
        headers = {"Content-Type": "application/octet-stream", "Accept": "application/json"}
        # http.client sends bytes with a Content-Length, and file objects and
        # iterables chunked, reading them blocksize bytes at a time.
        body: Any = _bytes(data) if isinstance(data, (bytes, bytearray, memoryview, str)) else data
        query = {"path": path, "mode": None if mode is None else format(mode, "04o")}
        conn, resp = self._client._open(
            "PUT", _sb(self.id, "files"), query=query, body=body, headers=headers, ok=(200, 201),
            timeout=self._client.timeout,
        )
        try:
            out = json.loads(resp.read())
        finally:
            conn.close()
        return int(out.get("size", 0))

    def _open_file(self, path: str):
        return self._client._open(
            "GET",
            _sb(self.id, "files"),
            query={"path": path},
            headers={"Accept": "application/octet-stream"},
            timeout=self._client.timeout,
        )

    def read_file(self, path: str) -> bytes:
        """The whole content of ``path`` (use read_file_to for large files)."""
        conn, resp = self._open_file(path)
        try:
            return resp.read()
        finally:
            conn.close()

    def read_file_to(self, path: str, fileobj: IO[bytes]) -> int:
        """Stream ``path`` into the binary file object ``fileobj``; returns the
        number of bytes written."""
        conn, resp = self._open_file(path)
        n = 0
        try:
            while chunk := resp.read(_CHUNK):
                fileobj.write(chunk)
                n += len(chunk)
        finally:
            conn.close()
        return n

    def list_files(self, path: str, depth: int | None = None) -> FileList:
        """FileInfo dicts (path, name, type, size, mode, mtime, ...) under
        directory ``path``; ``.truncated`` tells whether the server capped it."""
        out = self._client._json("GET", _sb(self.id, "files", "list"), query={"path": path, "depth": depth})
        fl = FileList(out.get("entries") or [])
        fl.truncated = bool(out.get("truncated"))
        return fl

    def stat(self, path: str) -> dict:
        """The FileInfo dict of ``path`` (NotFound if it does not exist)."""
        return self._client._json("GET", _sb(self.id, "files", "stat"), query={"path": path})

    def mkdir(self, path: str, parents: bool = True) -> None:
        """Create directory ``path`` (and its parents, by default)."""
        self._client._json("POST", _sb(self.id, "files", "mkdir"), {"path": path, "parents": parents}, ok=(204, 200))

    # -- directories as tar streams ----------------------------------------------

    def write_archive(self, path: str, data: bytes | IO[bytes] | Iterable[bytes]) -> dict:
        """Extract the uncompressed tar ``data`` (bytes, a binary file object or
        an iterable of bytes, streamed) into directory ``path``, made with its
        parents if missing; returns {"path", "entries", "size"}. The server
        refuses (InvalidRequest) absolute names, ``..``, writes through symlinks
        that lead outside ``path``, hard links to files the archive did not
        make, device nodes and FIFOs. Modes, symlinks, hard links and mtimes are
        kept; owners and setuid/setgid bits are not. A failure midway leaves
        what was made."""
        body: Any = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
        conn, resp = self._client._open(
            "PUT",
            _sb(self.id, "files", "archive"),
            query={"path": path},
            body=body,
            headers={"Content-Type": "application/x-tar", "Accept": "application/json"},
            timeout=self._client.timeout,
        )
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def _open_archive(self, path: str):
        return self._client._open(
            "GET",
            _sb(self.id, "files", "archive"),
            query={"path": path},
            headers={"Accept": "application/x-tar"},
            timeout=self._client.timeout,
        )

    def read_archive_to(self, path: str, fileobj: IO[bytes]) -> int:
        """Stream a tar of ``path`` (a file, or a directory and everything
        below it, named ``basename(path)/...``) into the binary file object
        ``fileobj``; returns the bytes written. The archive comes from the
        sandbox: extract it as hostile input (download_dir does)."""
        conn, resp = self._open_archive(path)
        n = 0
        try:
            while chunk := resp.read(_CHUNK):
                fileobj.write(chunk)
                n += len(chunk)
        finally:
            conn.close()
        return n

    def upload_dir(self, local_dir: str | os.PathLike, path: str) -> dict:
        """Copy the contents of ``local_dir`` into directory ``path`` (made, with
        its parents, if missing): files, directories, symlinks (as symlinks) and
        hard links, with their permission bits and mtimes; sockets, FIFOs and
        devices are left out. The tar is spooled to a temporary file, then
        streamed. Returns {"path", "entries", "size"}."""

        def regular(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return ti if ti.isreg() or ti.isdir() or ti.issym() or ti.islnk() else None

        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name in sorted(os.listdir(local_dir)):
                    tar.add(os.path.join(local_dir, name), arcname=name, filter=regular)
            tmp.seek(0)
            return self.write_archive(path, tmp)

    def download_dir(self, path: str, local_dir: str | os.PathLike) -> None:
        """Copy the contents of sandbox directory ``path`` into ``local_dir``
        (made if missing). The archive is the sandbox's, so it is extracted as
        hostile input, streamed, with tarfile's ``data`` filter: absolute names,
        ``..``, links (hard or symbolic) that are absolute or lead outside
        ``local_dir``, device nodes and FIFOs raise tarfile.FilterError;
        setuid/setgid bits and owners are dropped. Entries not under
        ``basename(path)`` raise too. A failure midway leaves what was made."""
        if not hasattr(tarfile, "data_filter"):
            raise RuntimeError("download_dir needs tarfile's data filter (Python 3.11.4 or later)")
        base = posixpath.basename(path.rstrip("/"))
        os.makedirs(local_dir, exist_ok=True)
        conn, resp = self._open_archive(path)
        try:
            with tarfile.open(fileobj=resp, mode="r|") as tar:
                tar.extractall(local_dir, members=_rebased(tar, base), filter="data")
        finally:
            conn.close()

    # -- code contexts ---------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        language: str | None = None,
        context: str | None = None,
        timeout_s: int | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_result: Callable[[Result], None] | None = None,
        return_files: str | Iterable[str] | None = None,
        on_status: Callable[[str], None] | None = None,
    ) -> "Execution":
        """Run ``code`` in a code context (state is kept between calls). With no
        ``context``, the default context of ``language`` (python by default) is
        used. Returns an Execution: stdout, stderr, results (Result MIME
        bundles, images as bytes), ``main`` (the last expression's value),
        ``error`` (an exception the code raised), ``timed_out`` and
        ``status``.

        ``return_files`` (a glob pattern or a list of them: ``*``, ``?``,
        ``[...]``, no ``**``; relative to the context's directory, or
        absolute) asks for the image files (.png, .jpg, .jpeg, .gif, .svg)
        the run creates or changes that match: each comes back as a Result
        with ``file`` set to its path (``Execution.files`` maps paths to
        them). At most 8 patterns; the server returns at most 16 files of at
        most 8 MiB and says on stderr what it left out.

        ``on_status`` gets the server's word on the run's progress while the
        context's interpreter starts ("starting python context", then "still
        starting python context (10s)"), never the code's output; the lines
        are kept in ``Execution.status`` too."""
        payload: dict = {"code": code}
        if language:
            payload["language"] = language
        if context:
            payload["context"] = context
        if timeout_s:
            payload["timeout_s"] = int(timeout_s)
        if return_files:
            payload["return_files"] = [return_files] if isinstance(return_files, str) else [str(p) for p in return_files]
        conn, resp = self._client._open(
            "POST",
            _sb(self.id, "code"),
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/x-ndjson"},
            timeout=None,
        )
        try:
            return read_code_stream(resp, on_stdout, on_stderr, on_result, on_status)
        finally:
            conn.close()

    def create_context(
        self, language: str = "python", id: str | None = None, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> dict:
        """Start a new code context; returns its description."""
        p: dict = {"language": language}
        if id:
            p["id"] = id
        if cwd:
            p["cwd"] = cwd
        if env:
            p["env"] = dict(env)
        return self._client._json("POST", _sb(self.id, "contexts"), p, ok=(201,))

    def list_contexts(self) -> list[dict]:
        return (self._client._json("GET", _sb(self.id, "contexts")) or {}).get("contexts", [])

    def delete_context(self, context_id: str) -> None:
        self._client._json("DELETE", _sb(self.id, "contexts", context_id), ok=(204,))

    def restart_context(self, context_id: str) -> dict:
        return self._client._json("POST", _sb(self.id, "contexts", context_id, "restart"))

    def interrupt_context(self, context_id: str) -> None:
        self._client._json("POST", _sb(self.id, "contexts", context_id, "interrupt"), ok=(204,))

    def rename(self, src: str, dst: str) -> None:
        """Rename or move ``src`` to ``dst`` within the guest's filesystem
        (rename(2): an existing file at ``dst`` is replaced; across
        filesystems the guest refuses it)."""
        self._client._json("POST", _sb(self.id, "files", "rename"), {"from": src, "to": dst}, ok=(204, 200))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path``; a non-empty directory needs recursive=True."""
        q = {"path": path, "recursive": "true" if recursive else None}
        self._client._json("DELETE", _sb(self.id, "files"), query=q, ok=(204, 200))


_MAX_LINE = 16 * 1024 * 1024


def _read_stream(
    resp: http.client.HTTPResponse,
    exec_id: str | None,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
) -> ExecResult:
    """Parse an exec NDJSON stream (base64 data) up to its exit record."""
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    cbs = {"stdout": on_stdout, "stderr": on_stderr}
    for rec in ndjson_records(resp, lambda: exec_id, "exit", _MAX_LINE):
        kind = rec.get("type")
        try:
            if kind in ("stdout", "stderr"):
                data = base64.b64decode(rec.get("data", ""), validate=True)
        except ValueError as e:
            raise StreamBroken(exec_id, f"bad record: {e}") from e
        if kind == "start":
            exec_id = rec.get("exec_id")
        elif kind in ("stdout", "stderr"):
            cb = cbs[kind]
            if cb is not None:
                cb(data)
            else:
                out[kind].append(data)
        elif kind == "exit":
            return ExecResult(
                exec_id=exec_id,
                stdout=b"".join(out["stdout"]),
                stderr=b"".join(out["stderr"]),
                exit_code=int(rec.get("code", 0)),
                signal=int(rec.get("signal") or 0),
                timed_out=bool(rec.get("timeout")),
                truncated=bool(rec.get("truncated")),
                duration_ms=int(rec.get("duration_ms") or 0),
                oom_killed=bool(rec.get("oom_killed")),
            )
        elif kind == "paused":
            # The sandbox was paused; the exec goes on when it resumes.
            raise ExecPaused(rec.get("exec_id") or exec_id, str(rec.get("message") or "the sandbox was paused"))
        elif kind == "error":
            # The server ended the stream (it is stopping); the exec goes on.
            err = rec.get("error") or {}
            raise StreamBroken(exec_id, f"{err.get('code', 'unavailable')}: {err.get('message', 'the server ended the stream')}")
        # Unknown record types are ignored (forward compatibility).
