"""An in-memory fake of the airlock API for the SDK's unit tests.

Execs are interpreted, not run: "echo ARGS" prints ARGS, "cat" echoes its
stdin, "bytes" prints all 256 byte values, "fail N" writes "boom" to stderr and
exits N, "python3" prints 42 (or, for a script that starts processes, how many
of 40 the request's pids_limit lets start), "sha256sum PATH" hashes a stored
file, "pids" prints the request's pids_limit.

Code is scripted too (see run_code): the first run in a context sends a status
line; "savefig(NAME)" writes a PNG, and so does each line
open("NAME", "w" or "wb").write(LITERAL) of a run: the image files among them
that match a return_files pattern come back as results with file set.

Each request's record (FakeServer.last()) holds its decoded JSON body under
"json" once the handler has read it.
"""

from __future__ import annotations

import ast
import base64
import fnmatch
import hashlib
import http.server
import io
import json
import re
import tarfile
import threading
import time
import urllib.parse

KEY = "al_testkey1_0123456789abcdefghijklmnopqrstuv"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


class FakeExec:
    def __init__(self, eid, cmd):
        self.id, self.cmd = eid, cmd
        self.recs: list[dict] = []
        self.stdin = bytearray()
        self.done = threading.Event()

    def out(self, kind, data: bytes):
        self.recs.append({"type": kind, "data": _b64(data)})

    def finish(self, code=0, signal=0, oom_killed=False):
        self.recs.append(
            {
                "type": "exit",
                "code": code,
                "signal": signal,
                "timeout": False,
                "truncated": False,
                "duration_ms": 7,
                "oom_killed": oom_killed,
            }
        )
        self.done.set()


class FakeState:
    def __init__(self):
        self.lock = threading.Lock()
        self.sandboxes: dict[str, dict] = {}
        self.files: dict[str, dict[str, bytes | None]] = {}
        self.execs: dict[str, dict[str, FakeExec]] = {}
        self.events: list[dict] = []
        self.requests: list[dict] = []  # method, path, query, headers, json (a JSON body)
        self.upload_started = threading.Event()
        self.next_id = 0
        self.contexts: dict[str, dict[str, dict]] = {}  # sandbox -> context id -> vars
        self.snapshots: dict[str, dict] = {}  # name -> wire object
        self.volumes: dict[str, dict] = {}  # name -> wire object (attachments from the sandboxes)
        self.vault: dict[str, dict] = {}  # name -> {"value", "hosts"}
        # archives: sandbox -> directory -> the last tar PUT there; GET sends
        # archive_out if set (a hostile guest), else that tar (get_archive).
        self.archives: dict[str, dict[str, bytes]] = {}
        self.archive_out: bytes | None = None

    def event(self, sb, action, detail):
        self.events.append(
            {"seq": len(self.events) + 1, "time": "2025-01-02T03:04:05Z", "tenant": "t1", "key_id": "testkey1",
             "sandbox_id": sb, "action": action, "detail": detail}
        )


def _network(n):
    """Check a create's network like the server: returns (public view,
    error status, message). Ports need an admin key (the fake's is not)."""
    out = {"mode": "public", "max_conns": 512}
    if n is None:
        return out, 0, ""
    if isinstance(n, str):
        if n not in ("public", "deny", "none"):
            return None, 400, f"network mode {n!r}: want public, deny or none"
        return {**out, "mode": n}, 0, ""
    unknown = set(n) - {"mode", "allow", "secrets", "ports", "rate_bytes", "max_conns"}
    if unknown:
        return None, 400, f"unknown field {sorted(unknown)[0]!r}"
    if n.get("ports"):
        return None, 403, "network.ports needs an admin key"
    out.update(n)
    if "mode" not in n and n.get("allow"):
        out["mode"] = "deny"
    secrets = []
    for i, sec in enumerate(n.get("secrets") or []):
        if sec.get("vault"):
            secrets.append({"name": sec["name"], "hosts": sec.get("hosts") or ["vault.example"],
                            "placeholder": "airlock-secret-%032d" % i, "vault": sec["vault"]})
            continue
        if not sec.get("value"):
            return None, 400, f"secret {sec.get('name')} has no value"
        secrets.append({"name": sec["name"], "hosts": sec["hosts"], "placeholder": "airlock-secret-%032d" % i})
    if secrets:
        out["secrets"] = secrets
    return out, 0, ""


def _file_info(p, b):
    return {"path": p, "name": p.rsplit("/", 1)[-1], "type": "dir" if b is None else "file",
            "size": 0 if b is None else len(b), "mode": 0o644, "mtime": "2025-01-02T03:04:05Z",
            "uid": 0, "gid": 0, "symlink_target": ""}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: FakeState  # set on the subclass made by start()

    def log_message(self, *a):  # quiet
        pass

    # -- plumbing --------------------------------------------------------------

    def _send(self, status, obj=None, ctype="application/json", raw=None):
        body = raw if raw is not None else (b"" if obj is None else json.dumps(obj).encode())
        self.send_response(status)
        self.send_header("X-Request-Id", "req-1")
        if status != 204:
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _fail(self, status, code, msg):
        self._send(status, {"error": {"code": code, "message": msg, "request_id": "req-1"}})

    def _body_chunks(self):
        """Yield the request body as it arrives (chunked or Content-Length)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = self.rfile.read(size)
                self.rfile.readline()
                yield data
        else:
            n = int(self.headers.get("Content-Length") or 0)
            while n > 0:
                data = self.rfile.read(min(n, 65536))
                if not data:
                    return
                n -= len(data)
                yield data

    def _body(self) -> bytes:
        return b"".join(self._body_chunks())

    def _json_body(self):
        try:
            body = json.loads(self._body() or b"{}")
        except ValueError:
            return None
        self._record["json"] = body
        return body

    def _stream(self, recs_source: FakeExec, first=None):
        self.send_response(200)
        self.send_header("X-Request-Id", "req-1")
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(b: bytes):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))

        if first:
            chunk(json.dumps(first).encode() + b"\n")
        recs_source.done.wait(10)
        for r in recs_source.recs:
            line = json.dumps(r).encode() + b"\n"
            # Split every record across two chunks to exercise line reassembly.
            chunk(line[:5])
            self.wfile.flush()
            chunk(line[5:])
        self.wfile.write(b"0\r\n\r\n")

    def _dispatch(self, method):
        u = urllib.parse.urlsplit(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(u.query, keep_blank_values=True).items()}
        st = self.state
        self._record = {"method": method, "path": u.path, "query": q, "headers": dict(self.headers)}
        with st.lock:
            st.requests.append(self._record)
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self._body()
            return self._fail(401, "unauthenticated", "missing or bad API key")
        routes = [
            ("POST", r"/v1/sandboxes", self.create),
            ("GET", r"/v1/sandboxes", self.list),
            ("GET", r"/v1/events", self.events),
            ("GET", r"/v1/server", self.server_overview),
            ("GET", r"/v1/sandboxes/(\w+)", self.get),
            ("DELETE", r"/v1/sandboxes/(\w+)", self.kill),
            ("POST", r"/v1/sandboxes/(\w+)/timeout", self.set_timeout),
            ("POST", r"/v1/sandboxes/(\w+)/pause", self.pause),
            ("POST", r"/v1/sandboxes/(\w+)/resume", self.resume),
            ("POST", r"/v1/sandboxes/(\w+)/keepalive", self.keepalive),
            ("GET", r"/v1/sandboxes/(\w+)/usage", self.usage),
            ("GET", r"/v1/sandboxes/(\w+)/network", self.get_network),
            ("PUT", r"/v1/sandboxes/(\w+)/network", self.set_network),
            ("GET", r"/v1/sandboxes/(\w+)/logs", self.logs),
            ("PUT", r"/v1/sandboxes/(\w+)/secrets/(\w+)", self.set_sandbox_secret),
            ("DELETE", r"/v1/sandboxes/(\w+)/secrets/(\w+)", self.remove_sandbox_secret),
            ("GET", r"/v1/secrets", self.list_vault),
            ("PUT", r"/v1/secrets/(\w+)", self.put_vault),
            ("DELETE", r"/v1/secrets/(\w+)", self.delete_vault),
            ("POST", r"/v1/sandboxes/(\w+)/snapshot", self.snapshot),
            ("POST", r"/v1/sandboxes/(\w+)/fork", self.fork),
            ("POST", r"/v1/sandboxes/(\w+)/browser", self.start_browser),
            ("GET", r"/v1/sandboxes/(\w+)/browser", self.browser_status),
            ("GET", r"/v1/snapshots", self.list_snapshots),
            ("POST", r"/v1/snapshots/prune", self.prune_snapshots),
            ("GET", r"/v1/snapshots/([\w.-]+)", self.get_snapshot),
            ("DELETE", r"/v1/snapshots/([\w.-]+)", self.delete_snapshot),
            ("POST", r"/v1/volumes", self.create_volume),
            ("GET", r"/v1/volumes", self.list_volumes),
            ("GET", r"/v1/volumes/([\w.-]+)", self.get_volume),
            ("POST", r"/v1/volumes/([\w.-]+)/resize", self.resize_volume),
            ("DELETE", r"/v1/volumes/([\w.-]+)", self.delete_volume),
            ("POST", r"/v1/sandboxes/(\w+)/exec", self.exec),
            ("GET", r"/v1/sandboxes/(\w+)/execs", self.list_execs),
            ("GET", r"/v1/sandboxes/(\w+)/execs/(\w+)", self.get_exec),
            ("GET", r"/v1/sandboxes/(\w+)/execs/(\w+)/stream", self.stream),
            ("POST", r"/v1/sandboxes/(\w+)/execs/(\w+)/stdin", self.stdin),
            ("POST", r"/v1/sandboxes/(\w+)/execs/(\w+)/signal", self.signal),
            ("PUT", r"/v1/sandboxes/(\w+)/files", self.put_file),
            ("GET", r"/v1/sandboxes/(\w+)/files", self.get_file),
            ("DELETE", r"/v1/sandboxes/(\w+)/files", self.delete_file),
            ("GET", r"/v1/sandboxes/(\w+)/files/list", self.list_files),
            ("GET", r"/v1/sandboxes/(\w+)/files/stat", self.stat),
            ("POST", r"/v1/sandboxes/(\w+)/files/mkdir", self.mkdir),
            ("POST", r"/v1/sandboxes/(\w+)/files/rename", self.rename),
            ("PUT", r"/v1/sandboxes/(\w+)/files/archive", self.put_archive),
            ("GET", r"/v1/sandboxes/(\w+)/files/archive", self.get_archive),
            ("POST", r"/v1/sandboxes/(\w+)/code", self.run_code),
            ("GET", r"/v1/sandboxes/(\w+)/contexts", self.list_contexts),
            ("POST", r"/v1/sandboxes/(\w+)/contexts", self.create_context),
            ("DELETE", r"/v1/sandboxes/(\w+)/contexts/([\w-]+)", self.delete_context),
            ("POST", r"/v1/sandboxes/(\w+)/contexts/([\w-]+)/restart", self.restart_context),
            ("POST", r"/v1/sandboxes/(\w+)/contexts/([\w-]+)/interrupt", self.interrupt_context),
        ]
        for m, pat, fn in routes:
            mo = re.fullmatch(pat, u.path)
            if m == method and mo:
                args = list(mo.groups())
                if args and pat.startswith("/v1/sandboxes/"):
                    if args[0] not in st.sandboxes:
                        self._body()
                        return self._fail(404, "not_found", "sandbox not found")
                    if len(args) > 1 and "/secrets/" in pat:
                        pass
                    elif len(args) > 1 and "/contexts/" in pat:
                        if args[1] not in st.contexts.setdefault(args[0], {}):
                            self._body()
                            return self._fail(404, "not_found", "context not found")
                    elif len(args) > 1:
                        e = st.execs[args[0]].get(args[1])
                        if e is None:
                            self._body()
                            return self._fail(404, "not_found", "exec not found")
                        args[1] = e
                return fn(q, *args)
        self._fail(404, "not_found", "no route")

    # -- code contexts (a tiny scripted "python") ------------------------------

    def run_code(self, q, sb):
        req = self._json_body()
        if req is None:
            return self._fail(400, "invalid", "bad JSON")
        patterns = req.get("return_files", [])
        if not isinstance(patterns, list) or len(patterns) > 8 or not all(isinstance(p, str) for p in patterns):
            return self._fail(400, "invalid", "return_files must be at most 8 strings")
        code, ctx = req.get("code", ""), req.get("context") or "default-" + (req.get("language") or "python")
        lang = req.get("language") or "python"
        recs = []
        if ctx not in self.state.contexts.setdefault(sb, {}):  # the run starts the context's interpreter
            recs.append({"type": "status", "data": f"starting {lang} context"})
        vars_ = self.state.contexts[sb].setdefault(ctx, {})
        m = re.fullmatch(r"(\w+) = (\d+)", code)
        m2 = re.fullmatch(r"(\w+) \* (\d+)", code)
        m3 = re.fullmatch(r"savefig\('([\w./-]+)'\)", code)
        writes = re.findall(r"""^open\("([\w./-]+)", "wb?"\)\.write\((.+)\)$""", code, re.M)
        written: dict[str, bytes] = {}  # the files the run wrote
        if m3:
            written[m3.group(1)] = b"\x89PNG\r\n\x1a\n" + m3.group(1).encode()
        elif writes:
            for name, literal in writes:
                v = ast.literal_eval(literal)
                written[name] = v.encode() if isinstance(v, str) else v
        elif m:
            vars_[m.group(1)] = int(m.group(2))
        elif m2 and m2.group(1) not in vars_:
            recs.append({"type": "error", "name": "NameError", "value": f"name {m2.group(1)!r} is not defined", "traceback": []})
        elif m2:
            recs.append({"type": "result", "main": True, "data": {"text/plain": str(vars_[m2.group(1)] * int(m2.group(2)))}})
        elif code == "1/0":
            recs.append({"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": ["Traceback", "ZeroDivisionError"]})
        elif code == "die()":  # the server gives up on the run: it says why, and sends no end line
            recs.append({"type": "stdout", "data": "partial\n"})
            recs.append({"type": "error", "name": "AirlockError", "value": "the sandbox stopped", "traceback": []})
            return self._send(200, raw=b"".join(json.dumps(r).encode() + b"\n" for r in recs), ctype="application/x-ndjson")
        elif code == "js()":  # IPython's Javascript display: a text type on the wire
            recs.append({"type": "result", "main": False, "data": {"application/javascript": "var x = 1;", "text/plain": "<JS>"}})
        elif code == "plot()":
            png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
            recs.append({"type": "result", "main": False, "data": {"image/png": png, "text/plain": "<Figure>"}})
        else:
            recs.append({"type": "stdout", "data": code + "\n"})
        mimes = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".svg": "image/svg+xml"}
        for name, data in written.items():
            mime = mimes.get(name[name.rfind("."):].lower()) if "." in name else None
            if mime and any(fnmatch.fnmatchcase(name, p) for p in patterns):
                v = data.decode() if mime == "image/svg+xml" else base64.b64encode(data).decode()
                recs.append({"type": "result", "main": False, "data": {mime: v}, "file": name})
        recs.append({"type": "end", "timed_out": False, "truncated": False, "duration_ms": 1, "execution_count": 1, "context": ctx})
        body = b"".join(json.dumps(r).encode() + b"\n" for r in recs)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _ctx_info(self, ctx_id):
        return {"id": ctx_id, "language": "python", "cwd": "/root", "created_at": "2026-01-01T00:00:00Z", "state": "idle", "is_default": ctx_id.startswith("default-")}

    def list_contexts(self, q, sb):
        self._body()
        self._send(200, {"contexts": [self._ctx_info(c) for c in sorted(self.state.contexts.get(sb, {}))]})

    def create_context(self, q, sb):
        req = json.loads(self._body() or b"{}")
        ctx = req.get("id") or "ctx-%d" % len(self.state.contexts.get(sb, {}))
        self.state.contexts.setdefault(sb, {})[ctx] = {}
        self._send(201, self._ctx_info(ctx))

    def delete_context(self, q, sb, ctx):
        self._body()
        del self.state.contexts[sb][ctx]
        self._send(204)

    def restart_context(self, q, sb, ctx):
        self._body()
        self.state.contexts[sb][ctx] = {}
        self._send(200, self._ctx_info(ctx))

    def interrupt_context(self, q, sb, ctx):
        self._body()
        self._send(204)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    # -- sandboxes -------------------------------------------------------------

    def create(self, q):
        st, body = self.state, self._json_body()
        if body is None:
            return self._fail(400, "invalid", "bad json")
        net, status, msg = _network(body.get("network"))
        if status:
            return self._fail(status, {400: "invalid", 403: "permission_denied"}[status], msg)
        if body.get("cpus", 1) > 32:
            return self._fail(429, "resource_exhausted", "limit cpus_per_tenant=32")
        source = ""
        if body.get("from_snapshot"):
            sn = st.snapshots.get(body["from_snapshot"])
            if sn is None:
                return self._fail(404, "not_found", "snapshot not found")
            if any(k in body for k in ("image", "cpus", "memory_mb", "env", "network")):
                return self._fail(400, "invalid", "from_snapshot: size, image, env and network come from the snapshot")
            body.update(image=sn["image"], cpus=sn["cpus"], memory_mb=sn["memory_mb"])
            source = "snapshot:" + sn["name"]
        mounts = []
        for v in body.get("volumes") or []:
            vol = st.volumes.get(v.get("name"))
            if vol is None:
                return self._fail(404, "not_found", "the image or a volume asked for was not found")
            ro = bool(v.get("read_only", False))
            if any(not (ro and a["read_only"]) for a in self._attachments(vol["name"])):
                return self._fail(409, "conflict", "a volume asked for is mounted elsewhere")
            mounts.append({"volume": vol["name"], "path": v["path"], "read_only": ro})
        for m in body.get("mounts") or []:
            # Like the server: read-only unless read_only is false.
            mounts.append({"host_path": m["host_path"], "path": m["path"], "read_only": m.get("read_only", True) is not False})
        with st.lock:
            st.next_id += 1
            sid = f"sb{st.next_id:010d}"
            sb = {"id": sid, "state": "running", "reason": "", "image": body.get("image") or "base",
                  "image_digest": "sha256:abc", "cpus": body.get("cpus", 1), "memory_mb": body.get("memory_mb", 512),
                  "disk_mb": 2048, "created_at": "2025-01-02T03:04:05Z", "expires_at": "2025-01-02T03:19:05Z",
                  "accel": "tcg", "guest_kernel": "6.1", "start_mode": "clone",
                  "metadata": body.get("metadata") or {}, "tenant": "t1", "_env": body.get("env") or {},
                  "network": net, "idle_pause_s": body.get("idle_pause_s", 0), "source": source,
                  "disk_usage_bytes": 3 << 20, "mounts": mounts}
            st.sandboxes[sid], st.files[sid], st.execs[sid] = sb, {}, {}
            st.event(sid, "sandbox.create", {})
        self._send(201, {k: v for k, v in sb.items() if not k.startswith("_")})

    def list(self, q):
        out = []
        for sb in self.state.sandboxes.values():
            if q.get("state") and sb["state"] != q["state"]:
                continue
            if any(k.startswith("metadata.") and sb["metadata"].get(k[9:]) != v for k, v in q.items()):
                continue
            out.append({k: v for k, v in sb.items() if not k.startswith("_")})
        self._send(200, {"sandboxes": out})

    def get(self, q, sid):
        self._send(200, {k: v for k, v in self.state.sandboxes[sid].items() if not k.startswith("_")})

    def kill(self, q, sid):
        with self.state.lock:
            del self.state.sandboxes[sid]
            self.state.event(sid, "sandbox.delete", {})
        self._send(204)

    def set_timeout(self, q, sid):
        body = self._json_body()
        sb = self.state.sandboxes[sid]
        sb["expires_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + body["timeout_s"]))
        self._send(200, {k: v for k, v in sb.items() if not k.startswith("_")})

    def get_network(self, q, sid):
        self._send(200, {"network": self.state.sandboxes[sid]["network"]})

    def set_network(self, q, sid):
        """Replaces mode and rules; a 10.x rule is the floor a tenant may
        not open; mode none is refused as the server refuses it."""
        body = self._json_body()
        allow = body.get("allow") or []
        if any(a.startswith("10.") for a in allow):
            return self._fail(403, "permission_denied", "network.allow opens private addresses, which needs an admin key")
        mode = body.get("mode") or ("deny" if allow else "public")
        sb = self.state.sandboxes[sid]
        if (mode == "none") != (sb["network"].get("mode") == "none"):
            return self._fail(400, "invalid", "network: a running sandbox cannot change to or from mode none")
        sb["network"] = dict(sb["network"], mode=mode, allow=allow)
        self.state.event(sid, "sandbox.network", {"new": {"mode": mode, "rules": len(allow)}})
        self._send(200, {"network": sb["network"], "closed": 0,
                         "applied": "resume" if sb["state"] == "paused" else "running"})

    # -- the vault and live secrets (values kept to check what was sent) -------

    def put_vault(self, q, name):
        body = self._json_body() or {}
        if not body.get("value"):
            return self._fail(400, "invalid", "value is required")
        self.state.vault[name] = {"value": body["value"], "hosts": body.get("hosts") or []}
        self._send(200, {"name": name, "hosts": self.state.vault[name]["hosts"],
                         "created_at": "2025-01-02T03:04:05Z", "updated_at": "2025-01-02T03:04:05Z"})

    def list_vault(self, q):
        self._send(200, {"secrets": [{"name": n, "hosts": v["hosts"], "created_at": "2025-01-02T03:04:05Z",
                                      "updated_at": "2025-01-02T03:04:05Z"} for n, v in sorted(self.state.vault.items())]})

    def delete_vault(self, q, name):
        if self.state.vault.pop(name, None) is None:
            return self._fail(404, "not_found", "secret not found")
        self._send(204)

    def set_sandbox_secret(self, q, sid, name):
        body = self._json_body() or {}
        sb = self.state.sandboxes[sid]
        if bool(body.get("value")) == bool(body.get("vault")):
            return self._fail(400, "invalid", "give the value or a vault name, not both")
        hosts = body.get("hosts")
        if body.get("vault"):
            v = self.state.vault.get(body["vault"])
            if v is None:
                return self._fail(400, "invalid", f"no secret {body['vault']!r} in the vault")
            hosts = hosts or v["hosts"]
        sec = {"name": name, "hosts": hosts, "placeholder": "airlock-secret-%032d" % 7}
        if body.get("vault"):
            sec["vault"] = body["vault"]
        secs = [s for s in sb["network"].get("secrets", []) if s["name"] != name] + [sec]
        sb["network"] = dict(sb["network"], secrets=secs)
        self.state.event(sid, "sandbox.secret.set", {"name": name})
        self._send(200, {"network": sb["network"], "closed": 0, "applied": "running"})

    def remove_sandbox_secret(self, q, sid, name):
        sb = self.state.sandboxes[sid]
        secs = sb["network"].get("secrets", [])
        if not any(s["name"] == name for s in secs):
            return self._fail(404, "not_found", "secret not found")
        sb["network"] = dict(sb["network"], secrets=[s for s in secs if s["name"] != name])
        self._send(200, {"network": sb["network"], "closed": 1, "applied": "running"})

    def pause(self, q, sid):
        """A sandbox with metadata busy=1 runs a command: refused without force."""
        body = self._json_body() or {}
        sb = self.state.sandboxes[sid]
        stats = {"state_bytes": 0, "save_ms": 0}
        if sb["state"] != "paused":
            if sb["metadata"].get("busy") == "1" and not body.get("force"):
                return self._fail(412, "failed_precondition", "sandbox has running commands; pause with force")
            sb.update(state="paused", paused_at="2025-01-02T03:05:00Z", lifetime_left_s=600)
            stats = {"state_bytes": 123 << 20, "save_ms": 800}
            self.state.event(sid, "sandbox.pause", {"force": bool(body.get("force"))})
        out = {k: v for k, v in sb.items() if not k.startswith("_")}
        out["pause"] = stats
        self._send(200, out)

    def resume(self, q, sid):
        self._body()
        sb = self.state.sandboxes[sid]
        if sb["state"] == "paused":
            sb["state"] = "running"
            sb.pop("lifetime_left_s", None)
            self.state.event(sid, "sandbox.resume", {})
        self._send(200, {k: v for k, v in sb.items() if not k.startswith("_")})

    def keepalive(self, q, sid):
        self._body()
        sb = self.state.sandboxes[sid]
        if sb["state"] == "paused":
            sb["state"] = "running"
            sb.pop("lifetime_left_s", None)
        self.state.keepalives = getattr(self.state, "keepalives", 0) + 1
        self._send(204)

    def logs(self, q, sid):
        text = "boot\nready\n"
        n = int(q.get("tail_bytes") or 0)
        trunc = 0 < n < len(text)
        if trunc:
            text = text[-n:]
        self._send(200, {"logs": [{"source": "console", "exists": True, "size": 11, "truncated": trunc, "text": text}]})

    def server_overview(self, q):
        states = dict.fromkeys(["creating", "running", "pausing", "paused", "resuming", "stopping", "failed"], 0)
        for sb in self.state.sandboxes.values():
            states[sb["state"]] += 1
        quota = {"max_sandboxes": 20, "max_vcpus": 32, "max_memory_mb": 32768, "max_disk_mb": 65536, "max_snapshots": 100}
        self._send(200, {
            "admin": False, "sandboxes": states,
            "activity": {"since": "2026-11-25T13:00:00Z", "bucket_s": 3600, "creates": [1, 0, 2], "failures": [0, 0, 1]},
            "tenants": [{"tenant": "t1", "sandboxes": len(self.state.sandboxes), "vcpus": 1, "memory_mb": 512, "disk_mb": 2048,
                         "snapshots": 0, "snapshots_disk_mb": 0, "quota": quota}],
            "runtime": {"name": "qemu"},
        })

    def usage(self, q, sid):
        self._body()
        sb = self.state.sandboxes[sid]
        if sb["state"] != "running":  # never resumes
            return self._fail(412, "failed_precondition", f"the sandbox is {sb['state']}: usage is sampled only while it runs")
        out = {"sandbox_id": sid, "sampled_at": "2026-11-26T05:30:00.25Z", "cpus": sb["cpus"], "cpu_seconds": 1.5,
               "memory_bytes": 384 << 20, "memory_limit_bytes": 512 << 20, "disk_bytes": 256 << 20, "disk_limit_bytes": 2 << 30}
        if (sb.get("network") or {}).get("mode") != "none":
            out["network"] = {"receive_bytes": 3 << 20, "transmit_bytes": 1 << 20, "connections": 2}
        self._send(200, out)

    # -- snapshots and forks ---------------------------------------------------

    def snapshot(self, q, sid):
        body = self._json_body() or {}
        st, sb = self.state, self.state.sandboxes[sid]
        if not body.get("name"):
            return self._fail(400, "invalid", "name is required")
        if body["name"] in st.snapshots:
            return self._fail(409, "conflict", "the tenant already has a snapshot of that name")
        sn = {"name": body["name"], "id": "snap%d" % len(st.snapshots), "sandbox_id": sid, "tenant": "t1",
              "image": sb["image"], "image_digest": "sha256:abc", "cpus": sb["cpus"], "memory_mb": sb["memory_mb"],
              "disk_mb": 2048, "network": sb["network"], "size_bytes": 64 << 20, "created_at": "2025-01-02T03:06:00Z"}
        st.snapshots[sn["name"]] = sn
        st.event(sid, "snapshot.create", {"name": sn["name"], "force": bool(body.get("force"))})
        self._send(201, sn)

    def list_snapshots(self, q):
        self._send(200, {"snapshots": list(self.state.snapshots.values())})

    def get_snapshot(self, q, name):
        sn = self.state.snapshots.get(name)
        if sn is None:
            return self._fail(404, "not_found", "snapshot not found")
        self._send(200, sn)

    def delete_snapshot(self, q, name):
        self._body()
        st = self.state
        if name not in st.snapshots:
            return self._fail(404, "not_found", "snapshot not found")
        if any(sb.get("source") == "snapshot:" + name for sb in st.sandboxes.values()):
            return self._fail(412, "failed_precondition", "the snapshot backs the disks of sandboxes")
        del st.snapshots[name]
        self._send(204)

    # -- volumes ---------------------------------------------------------------

    def _attachments(self, name):
        return [{"sandbox_id": sb["id"], "path": m["path"], "read_only": m["read_only"]}
                for sb in self.state.sandboxes.values() for m in sb.get("mounts", []) if m.get("volume") == name]

    def _volume(self, name):
        return dict(self.state.volumes[name], attachments=self._attachments(name))

    def create_volume(self, q):
        body = self._json_body() or {}
        st = self.state
        if not body.get("name") or body.get("size_mb", 0) < 16:
            return self._fail(400, "invalid", "name and size_mb (at least 16) are required")
        if body["name"] in st.volumes:
            return self._fail(409, "conflict", "the tenant already has a volume of that name")
        st.volumes[body["name"]] = {"name": body["name"], "id": "vol%d" % len(st.volumes), "tenant": "t1",
                                    "size_mb": body["size_mb"], "allocated_bytes": 1 << 20,
                                    "created_at": "2025-01-02T03:06:00Z", "guest_written": False}
        self._send(201, self._volume(body["name"]))

    def list_volumes(self, q):
        self._send(200, {"volumes": [self._volume(n) for n in self.state.volumes]})

    def get_volume(self, q, name):
        if name not in self.state.volumes:
            return self._fail(404, "not_found", "volume not found")
        self._send(200, self._volume(name))

    def resize_volume(self, q, name):
        body = self._json_body() or {}
        vol = self.state.volumes.get(name)
        if vol is None:
            return self._fail(404, "not_found", "volume not found")
        if self._attachments(name):
            return self._fail(409, "conflict", "the volume is mounted by a sandbox")
        if body.get("size_mb", 0) < vol["size_mb"]:
            return self._fail(400, "invalid", "a volume can only grow")
        vol["size_mb"] = body["size_mb"]
        self._send(200, self._volume(name))

    def delete_volume(self, q, name):
        self._body()
        if name not in self.state.volumes:
            return self._fail(404, "not_found", "volume not found")
        if self._attachments(name):
            return self._fail(409, "conflict", "the volume is mounted by a sandbox")
        del self.state.volumes[name]
        self._send(204)

    def prune_snapshots(self, q):
        self._body()
        self._fail(403, "permission_denied", "pruning snapshots needs an admin key")

    def fork(self, q, sid):
        body = self._json_body() or {}
        count = body.get("count", 1)
        if not 1 <= count <= 16:
            return self._fail(400, "invalid", "count must be between 1 and 16")
        st, out = self.state, []
        with st.lock:
            for _ in range(count):
                st.next_id += 1
                fid = f"sb{st.next_id:010d}"
                sb = dict(st.sandboxes[sid], id=fid, source="fork:" + sid)
                st.sandboxes[fid], st.files[fid], st.execs[fid] = sb, {}, {}
                out.append({k: v for k, v in sb.items() if not k.startswith("_")})
            st.event(sid, "sandbox.fork", {"count": count})
        self._send(201, {"sandboxes": out})

    def start_browser(self, q, sid):
        body = self._json_body() or {}
        with self.state.lock:
            sb = self.state.sandboxes[sid]
            if sb.get("image") != "browser":
                return self._fail(412, "failed_precondition", "this sandbox has no browser")
            sb["_browser"] = True
        base = f"ws://{self.headers['Host']}/v1/sandboxes/{sid}/browser/cdp"
        out = {"running": True, "browser": "Chrome/156.0.0.0", "sandbox": True, "cdp_url": base,
               "cdp_http_url": base.replace("ws://", "http://"), "vnc_url": base[:-4] + "/vnc"}
        if body.get("interactive"):
            out["vnc_url"] += "?interactive=1"
        ttl = body.get("ttl_s", 600)
        if not 0 < ttl <= 3600:
            return self._fail(400, "invalid", "ttl_s must be between 1 and 3600")
        out["signed_cdp_url"] = base + "?token=t" + str(ttl)
        self._send(200, out)

    def browser_status(self, q, sid):
        with self.state.lock:
            running = bool(self.state.sandboxes[sid].get("_browser"))
        self._send(200, {"running": running})

    # -- exec ------------------------------------------------------------------

    def exec(self, q, sid):
        if q.get("encoding") != "base64":
            self._body()
            return self._fail(400, "invalid", "this fake only speaks ?encoding=base64")
        st, body = self.state, self._json_body()
        if not body or not body.get("cmd"):
            return self._fail(400, "invalid", "cmd is required")
        pids = body.get("pids_limit", 0)
        if type(pids) is not int or not 0 <= pids <= 4 << 20:
            return self._fail(400, "invalid", "pids_limit must be between 0 and 4194304")
        cmd = body["cmd"]
        with st.lock:
            eid = f"ex{len(st.execs[sid]) + 1:014d}"
            e = FakeExec(eid, cmd)
            st.execs[sid][eid] = e
            if body.get("stdin") is not None:
                e.stdin += base64.b64decode(body["stdin"])
            env = {**st.sandboxes[sid]["_env"], **(body.get("env") or {})}
            if cmd[0] == "echo":
                e.out("stdout", (" ".join(cmd[1:]) + "\n").encode())
                e.finish()
            elif cmd[0] == "env":
                e.out("stdout", "".join(f"{k}={v}\n" for k, v in sorted(env.items())).encode())
                e.out("stdout", f"cwd={body.get('cwd')} user={body.get('user')} timeout={body.get('timeout_s')}\n".encode())
                e.finish()
            elif cmd[0] == "bytes":
                e.out("stdout", bytes(range(256)))
                e.finish()
            elif cmd[0] == "balloon":
                e.finish(-1, 9, oom_killed=True)
            elif cmd[0] == "fail":
                e.out("stderr", b"boom")
                e.finish(int(cmd[1]))
            elif cmd[0] == "pids":
                e.out("stdout", f"pids_limit={body.get('pids_limit')}\n".encode())
                e.finish()
            elif cmd[0] == "python3" and "subprocess.Popen" in cmd[-1]:
                # test_live's _SPAWN: 40 sleeps, as many as the limit lets start
                # (python3 is one task); the guest's default is 1024.
                e.out("stdout", f"{min(40, (body.get('pids_limit') or 1024) - 1)}\n".encode())
                e.finish()
            elif cmd[0] == "python3":
                e.out("stdout", b"42\n")
                e.finish()
            elif cmd[0] == "sha256sum":
                e.out("stdout", f"{hashlib.sha256(st.files[sid][cmd[1]]).hexdigest()}  {cmd[1]}\n".encode())
                e.finish()
            elif cmd[0] == "cat":
                if not body.get("stdin_open"):
                    e.out("stdout", bytes(e.stdin))
                    e.finish()
            else:
                e.out("stderr", f"{cmd[0]}: not found\n".encode())
                e.finish(127)
        if body.get("background"):
            return self._send(202, {"exec_id": eid, "pid": 42})
        self._stream(e, first={"type": "start", "exec_id": eid, "pid": 42})

    def _exec_wire(self, e: FakeExec):
        done = e.done.is_set()
        return {"exec_id": e.id, "cmd": e.cmd, "pid": 42, "state": "exited" if done else "running",
                "started_at": "2025-01-02T03:04:05Z", "ended_at": "2025-01-02T03:04:06Z" if done else None,
                "exit": e.recs[-1] if done else None}

    def list_execs(self, q, sid):
        self._send(200, {"execs": [self._exec_wire(e) for e in self.state.execs[sid].values()]})

    def get_exec(self, q, sid, e):
        self._send(200, self._exec_wire(e))

    def stream(self, q, sid, e):
        if q.get("encoding") != "base64":
            return self._fail(400, "invalid", "this fake only speaks ?encoding=base64")
        self._stream(e)

    def stdin(self, q, sid, e):
        data = self._body()
        with self.state.lock:
            if e.done.is_set():
                return self._fail(409, "conflict", "exec has exited")
            e.stdin += data
            if q.get("close") == "true":
                e.out("stdout", bytes(e.stdin))
                e.finish()
        self._send(204)

    def signal(self, q, sid, e):
        body = self._json_body()
        with self.state.lock:
            if e.done.is_set():
                return self._fail(409, "conflict", "exec has exited")
            e.finish(-1, body["signal"])
        self._send(204)

    # -- files -----------------------------------------------------------------

    def put_file(self, q, sid):
        p = q.get("path", "")
        if not p.startswith("/") or "\x00" in p:
            self._body()
            return self._fail(400, "invalid", "bad path")
        parts = []
        for c in self._body_chunks():
            parts.append(c)
            self.state.upload_started.set()
        data = b"".join(parts)
        with self.state.lock:
            self.state.files[sid][p] = data
            self.state.event(sid, "file.write", {"path": p, "size": len(data)})
        self._send(200, {"path": p, "size": len(data)})

    def get_file(self, q, sid):
        b = self.state.files[sid].get(q.get("path"))
        if b is None:
            return self._fail(404, "not_found", "no such file")
        self._send(200, raw=b, ctype="application/octet-stream")

    def delete_file(self, q, sid):
        if q.get("path") not in self.state.files[sid]:
            return self._fail(404, "not_found", "no such file")
        del self.state.files[sid][q["path"]]
        self._send(204)

    def list_files(self, q, sid):
        d = q["path"].rstrip("/") + "/"
        out = [_file_info(p, b) for p, b in self.state.files[sid].items() if p.startswith(d) and "/" not in p[len(d):]]
        self._send(200, {"entries": out, "truncated": False})

    def stat(self, q, sid):
        files = self.state.files[sid]
        if q.get("path") not in files:
            return self._fail(404, "not_found", "no such file")
        self._send(200, _file_info(q["path"], files[q["path"]]))

    def mkdir(self, q, sid):
        body = self._json_body()
        self.state.files[sid][body["path"]] = None
        self._send(204)

    def rename(self, q, sid):
        body = self._json_body()
        files = self.state.files[sid]
        if body.get("from") not in files or not str(body.get("to", "")).startswith("/"):
            return self._fail(404, "not_found", "no such file")
        files[body["to"]] = files.pop(body["from"])
        self._send(204)

    def put_archive(self, q, sid):
        p = q.get("path", "")
        data = self._body()
        if not p.startswith("/") or "\x00" in p:
            return self._fail(400, "invalid", "bad path")
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                members = tar.getmembers()
        except tarfile.TarError as e:
            return self._fail(400, "invalid", f"not a tar: {e}")
        for m in members:
            if m.name.startswith("/") or ".." in m.name.split("/"):
                return self._fail(400, "invalid", f"entry {m.name!r} leaves the directory")
        with self.state.lock:
            self.state.archives.setdefault(sid, {})[p] = data
            self.state.event(sid, "file.extract", {"path": p, "entries": len(members)})
        self._send(200, {"path": p, "entries": len(members), "size": sum(m.size for m in members if m.isreg())})

    def get_archive(self, q, sid):
        """archive_out if set; else the tar last PUT into the path, with its
        names put under basename(path)/ as the server names them."""
        p = q.get("path", "")
        if self.state.archive_out is not None:
            return self._send(200, raw=self.state.archive_out, ctype="application/x-tar")
        data = self.state.archives.get(sid, {}).get(p)
        if data is None:
            return self._fail(404, "not_found", "no such file")
        base = p.rsplit("/", 1)[-1]
        out = io.BytesIO()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, \
                tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
            root = tarfile.TarInfo(base)
            root.type, root.mode = tarfile.DIRTYPE, 0o750
            dst.addfile(root)
            for m in src.getmembers():
                f = src.extractfile(m) if m.isreg() else None
                m.name = base + "/" + m.name
                if m.islnk():
                    m.linkname = base + "/" + m.linkname
                dst.addfile(m, f)
        self._send(200, raw=out.getvalue(), ctype="application/x-tar")

    # -- events ----------------------------------------------------------------

    def events(self, q):
        since, limit = int(q.get("since", 0)), int(q.get("limit", 0))
        out, nxt = [], since
        for ev in self.state.events:
            if ev["seq"] <= since or (q.get("sandbox") and ev["sandbox_id"] != q["sandbox"]):
                continue
            t = q.get("type")
            if t and ev["action"] != t and not ev["action"].startswith(t + "."):
                continue
            if limit and len(out) == limit:
                break
            out.append(ev)
            nxt = ev["seq"]
        self._send(200, {"events": out, "next": nxt})


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up early is fine
            super().handle_error(request, client_address)


class FakeServer:
    """A running fake on 127.0.0.1; use as a context manager."""

    def __init__(self, handler_cls=None):
        self.state = FakeState()
        cls = handler_cls or type("BoundHandler", (Handler,), {"state": self.state})
        self.httpd = _QuietServer(("127.0.0.1", 0), cls)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def last(self):
        return self.state.requests[-1]
