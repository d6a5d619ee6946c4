"""The Python SDK against the API's contract, api/openapi.yaml.

The SDK has no typed models of the API's objects: it hands the server's
answers to the caller as plain dicts (Sandbox.info, list_execs, stat,
get_snapshot, ...), and builds its requests as dicts. So there is nothing to
compare field by field with the spec's schemas; instead every public method
is run against a server made from the spec, which checks

* every request: the operation exists, each query parameter is one the
  operation documents, and each key of a JSON body (nested ones too) is a
  property of the operation's request schema, with a compatible JSON type;
* every read: each answer is built from the spec with every property its
  schema has, and the dicts the SDK decodes record the keys it looks up; a
  key the SDK reads that the answer lacks is a field the spec does not have.

Needs PyYAML (Debian's python3-yaml, installed by scripts/deps.sh); no
airlock server.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import tarfile
import tempfile
import threading
import unittest
import urllib.parse

import yaml

import _path  # noqa: F401  (sdk/python on sys.path)
import airlock

SPEC_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "api", "openapi.yaml")

# Public methods not run here, each with the reason.
NOT_RUN = {
    "Client.port_url": "builds a URL, sends nothing",
    "Sandbox.port_url": "builds a URL, sends nothing",
    "Sandbox.terminal": "a WebSocket (GET .../pty), whose messages are not JSON bodies of the spec",
    "Sandbox.download_dir": "needs tarfile's data filter (Python 3.11.4+); read_archive_to sends the same request",
}

# Query parameters the spec describes in prose rather than as parameters.
PROSE_QUERY = {
    ("GET", "/v1/sandboxes"): re.compile(r"^metadata\..+$"),  # metadata.<k>=<v>, in the operation's description
}

_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}

_DECODER = json.JSONDecoder()  # the server's own: not the SDK's patched json.loads


def _load_spec() -> dict:
    with open(SPEC_FILE, encoding="utf-8") as f:
        return yaml.safe_load(f)


class Spec:
    def __init__(self, doc: dict):
        self.doc = doc
        self.ops = []  # (method, template, regex, operation, path item)
        for tmpl, item in doc["paths"].items():
            pat = re.sub(r"\\\{([a-z_]+)\\\}", lambda m: ".*" if m.group(1) == "path" else "[^/]+", re.escape(tmpl))
            for method, op in item.items():
                if method in ("parameters", "summary", "description"):
                    continue
                self.ops.append((method.upper(), tmpl, re.compile("^" + pat + "$"), op, item))

    def resolve(self, s):
        for _ in range(16):
            if not isinstance(s, dict) or "$ref" not in s:
                return s
            cur = self.doc
            for part in s["$ref"].lstrip("#/").split("/"):
                cur = cur[part]
            s = cur
        return s

    def find(self, method: str, path: str):
        best = None
        for m, tmpl, rx, op, item in self.ops:
            if m == method and rx.match(path) and (best is None or len(tmpl) > len(best[0])):
                best = (tmpl, op, item)
        return best

    def params(self, op: dict, item: dict) -> set[str]:
        out = set()
        for p in list(item.get("parameters") or []) + list(op.get("parameters") or []):
            p = self.resolve(p)
            if p.get("in") == "query":
                out.add(p["name"])
        return out

    def props(self, s) -> dict:
        s = self.resolve(s)
        out = dict(s.get("properties") or {})
        for part in s.get("allOf") or []:
            out.update(self.props(part))
        return out

    def alternatives(self, s) -> list:
        s = self.resolve(s)
        if "oneOf" in s:
            return [self.resolve(a) for a in s["oneOf"]]
        return [s]

    @staticmethod
    def json_type(s: dict) -> str:
        if "type" in s:
            return s["type"]
        if "properties" in s or "allOf" in s:
            return "object"
        return ""

    def sample(self, s, line_type: str | None = None):
        """A value of schema s with every property present."""
        alts = self.alternatives(s)
        s = alts[0]
        if line_type == "result":  # a result line's data is the MIME bundle
            s = next((a for a in alts if self.json_type(a) == "object"), s)
        t = self.json_type(s)
        if t == "object":
            props = self.props(s)
            if props:
                return {k: self.sample(v) for k, v in props.items()}
            ap = s.get("additionalProperties")
            return {"text/plain": self.sample(ap)} if isinstance(ap, dict) else {}
        if t == "array":
            return [self.sample(s.get("items") or {})]
        if t == "integer":
            return int(s.get("minimum", 0))
        if t == "number":
            return 0.0
        if t == "boolean":
            return False
        if t == "string":
            if s.get("enum"):
                return s["enum"][0]
            if s.get("format") == "date-time":
                return "2026-01-02T03:04:05Z"
            return "a" * 20  # a sandbox or exec id, text and base64 alike
        return {}

    def check_value(self, value, s, where: str, errs: list[str]) -> None:
        """Records in errs how value departs from schema s (keys and types)."""
        if value is None:
            return
        alts = self.alternatives(s)
        want = _JSON_TYPES[type(value)]
        match = [a for a in alts if self.json_type(a) in ("", want) or (want == "integer" and self.json_type(a) == "number")]
        if not match:
            errs.append(f"{where}: the SDK sends {want}, the spec wants {[self.json_type(a) for a in alts]}")
            return
        s = match[0]
        if want == "object":
            props = self.props(s)
            ap = s.get("additionalProperties")
            for k, v in value.items():
                if k in props:
                    self.check_value(v, props[k], f"{where}.{k}", errs)
                elif isinstance(ap, dict):
                    self.check_value(v, ap, f"{where}{{}}", errs)
                elif props or ap is False:
                    errs.append(f"{where}: the SDK sends {k!r}, which the spec's request does not have")
        elif want == "array":
            for v in value:
                self.check_value(v, s.get("items") or {}, f"{where}[]", errs)


class Probe(dict):
    """A decoded JSON object that records the keys read from it."""

    log: list[tuple[str, bool]] = []

    def __getitem__(self, k):
        Probe.log.append((k, dict.__contains__(self, k)))
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        Probe.log.append((k, dict.__contains__(self, k)))
        return dict.get(self, k, default)

    def __contains__(self, k):
        Probe.log.append((k, dict.__contains__(self, k)))
        return dict.__contains__(self, k)


class SpecServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, spec: Spec):
        super().__init__(("127.0.0.1", 0), SpecHandler)
        self.spec = spec
        self.errors: list[str] = []
        self.calls: list[str] = []
        self.fail_next: str | None = None  # "error": an Error answer; "stream-error": a broken exec stream


class SpecHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _any(self):
        srv: SpecServer = self.server
        spec = srv.spec
        u = urllib.parse.urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self._read_chunked()
        else:
            body = self.rfile.read(n) if n else b""
        found = spec.find(self.command, u.path)
        if found is None:
            srv.errors.append(f"{self.command} {u.path}: not in the spec")
            return self._send(404, "application/json", b"{}")
        tmpl, op, item = found
        name = f"{self.command} {tmpl}"
        srv.calls.append(name)
        allowed = spec.params(op, item)
        for q in urllib.parse.parse_qs(u.query, keep_blank_values=True):
            prose = PROSE_QUERY.get((self.command, tmpl))
            if q not in allowed and not (prose and prose.match(q)):
                srv.errors.append(f"{name}: query parameter {q!r} is not in the spec")
        rb = (op.get("requestBody") or {}).get("content") or {}
        if body and "application/json" in (self.headers.get("Content-Type") or ""):
            if "application/json" not in rb:
                srv.errors.append(f"{name}: the SDK sends a JSON body, the spec none")
            else:
                spec.check_value(_DECODER.decode(body.decode()), rb["application/json"]["schema"], name, srv.errors)
        fail, srv.fail_next = srv.fail_next, None
        if fail == "error":
            err = spec.resolve({"$ref": "#/components/responses/Error"})["content"]["application/json"]["schema"]
            body = spec.sample(err)
            body["error"]["code"] = "not_found"
            return self._send(404, "application/json", json.dumps(body).encode())
        accept = self.headers.get("Accept") or ""
        for status, resp in sorted(op["responses"].items()):
            if not str(status).startswith("2"):
                continue
            content = spec.resolve(resp).get("content") or {}
            if not content:
                return self._send(int(status), None, b"")
            for mt, c in content.items():
                if mt == "application/json" and "ndjson" not in accept:
                    return self._send(int(status), mt, json.dumps(spec.sample(c["schema"])).encode())
                if mt == "application/x-ndjson" and "ndjson" in accept:
                    return self._send(int(status), mt, self._ndjson(c["schema"], fail == "stream-error"))
                if mt == "text/plain" and "json" not in accept:
                    return self._send(int(status), mt, b"step 1/1: RUN true\n")
                if mt in ("application/octet-stream", "application/x-tar") and "json" not in accept:
                    return self._send(int(status), mt, self._tar() if mt == "application/x-tar" else b"bytes")
        srv.errors.append(f"{name}: no answer in the spec for Accept {accept!r}")
        return self._send(500, "application/json", b"{}")

    def _ndjson(self, schema, broken: bool) -> bytes:
        spec: Spec = self.server.spec
        s = spec.resolve(schema)
        props = spec.props(s)
        key = "type" if "type" in props else "kind"  # a build's events say their kind
        types = list(props[key]["enum"])
        last = [t for t in types if t in ("exit", "end", "built")]
        lines = []
        for t in [t for t in types if t not in last] + last:
            if broken and t in ("exit", "end", "built"):
                continue
            if not broken and t in ("error", "paused") and ("exit" in types or "built" in types):
                continue  # an exec stream's (or build's) error or paused line ends it: the broken run sends them
            line = spec.sample(s, line_type=t)
            line[key] = t
            if t == "result":
                line["data"] = {"text/plain": "42"}
            lines.append(json.dumps(line))
        return ("\n".join(lines) + "\n").encode()

    @staticmethod
    def _tar() -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("f")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"x"))
        return buf.getvalue()

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                self.rfile.readline()
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline()

    def _send(self, status: int, ctype: str | None, body: bytes):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Request-Id", "req")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any


class SDKMatchesSpec(unittest.TestCase):
    def setUp(self):
        self.spec = Spec(_load_spec())
        self.srv = SpecServer(self.spec)
        t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        t.start()
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)
        real_loads = json.loads

        def loads(s, *args, **kw):
            kw.setdefault("object_hook", Probe)
            return real_loads(s, *args, **kw)

        json.loads = loads
        self.addCleanup(setattr, json, "loads", real_loads)
        Probe.log = []
        self.client = airlock.Client(f"http://127.0.0.1:{self.srv.server_address[1]}", "e2b_" + "0" * 50, timeout=10)

    def test_requests_and_reads(self):
        c = self.client
        run: set[str] = set()

        def call(name, fn, *args, **kw):
            run.add(name)
            return fn(*args, **kw)

        sid = "a" * 20
        net = {
            "mode": "deny",
            "allow": ["example.com"],
            "secrets": [{"name": "TOKEN", "hosts": ["api.example.com"], "value": "v"}, {"name": "GH", "vault": "GH"}],
            "ports": [{"host_ip": "127.0.0.1", "host_port": 0, "guest_port": 8000}],
            "rate_bytes": 1,
            "max_conns": 1,
        }
        sb = call("Client.create", c.create, image="base", cpus=1, memory_mb=512, disk_mb=2048, timeout_s=60,
                  env={"A": "1"}, metadata={"k": "v"}, network=net, idle_pause_s=0)
        call("Client.create", c.create, from_snapshot="snap", idle_pause_s=60, network="none")
        call("Client.create", c.create, volumes=[{"name": "data", "path": "/data", "read_only": True}],
             mounts=[{"host_path": "/srv", "path": "/srv", "read_only": False}])
        with tempfile.TemporaryDirectory() as ctx:
            with open(os.path.join(ctx, "Dockerfile"), "w", encoding="utf-8") as f:
                f.write("FROM base\nRUN true\n")
            events = []
            call("Client.build_template", c.build_template, "web", ctx, start="python3 -m http.server", ready="true",
                 ready_timeout=30, build_args={"V": "1"}, cpus=1, memory_mb=512, disk_mb=2048, no_cache=True,
                 on_event=events.append)
            self.assertTrue(events, "build_template reported no progress")
            with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile") as df:
                df.write("FROM base\n")
                df.flush()
                call("Client.build_template", c.build_template, "web", ctx, dockerfile=df.name)
        call("Client.list_templates", c.list_templates)
        call("Client.get_template", c.get_template, "web")
        call("Client.template_log", c.template_log, "web")
        call("Client.delete_template", c.delete_template, "web")
        call("Client.prune_templates", c.prune_templates)
        call("Client.create_volume", c.create_volume, "data", 64)
        call("Client.list_volumes", c.list_volumes)
        call("Client.get_volume", c.get_volume, "data")
        call("Client.resize_volume", c.resize_volume, "data", 128)
        call("Client.delete_volume", c.delete_volume, "data")
        sb = call("Client.sandbox", c.sandbox, sid)
        call("Client.get", c.get, sid)
        call("Client.list", c.list, state="running", metadata={"k": "v"})
        call("Client.pause", c.pause, sid, force=True)
        call("Client.resume", c.resume, sid)
        call("Client.keepalive", c.keepalive, sid)
        call("Client.usage", c.usage, sid)
        call("Client.get_network", c.get_network, sid)
        call("Client.set_network", c.set_network, sid, mode="deny", allow=["pypi.org"])
        call("Client.set_vault_secret", c.set_vault_secret, "GH", "v", hosts=["api.github.com"])
        call("Client.list_vault_secrets", c.list_vault_secrets)
        call("Client.delete_vault_secret", c.delete_vault_secret, "GH")
        call("Client.set_sandbox_secret", c.set_sandbox_secret, sid, "TOKEN", vault="GH", hosts=["api.github.com"])
        call("Client.set_sandbox_secret", c.set_sandbox_secret, sid, "TOKEN", value="v", hosts=["api.github.com"])
        call("Client.remove_sandbox_secret", c.remove_sandbox_secret, sid, "TOKEN")
        call("Client.snapshot", c.snapshot, sid, "snap", force=True)
        call("Client.list_snapshots", c.list_snapshots)
        call("Client.get_snapshot", c.get_snapshot, "snap")
        call("Client.delete_snapshot", c.delete_snapshot, "snap")
        call("Client.prune_snapshots", c.prune_snapshots)
        call("Client.fork", c.fork, sid, count=2, force=True)
        call("Client.start_browser", c.start_browser, sid, interactive=True, signed_ttl_s=60)
        call("Client.browser_status", c.browser_status, sid)
        call("Client.events", c.events, sandbox=sid, type="net", since=1, limit=10)
        call("Client.healthz", c.healthz)
        call("Client.server", c.server)
        call("Client.kill", c.kill, sid)

        call("Sandbox.id", lambda: sb.id)
        call("Sandbox.state", lambda: sb.state)
        call("Sandbox.network", lambda: sb.network)
        call("Sandbox.mounts", lambda: sb.mounts)
        call("Sandbox.refresh", sb.refresh)
        call("Sandbox.set_timeout", sb.set_timeout, 60)
        call("Sandbox.pause", sb.pause, force=True)
        call("Sandbox.resume", sb.resume)
        call("Sandbox.keepalive", sb.keepalive)
        call("Sandbox.usage", sb.usage)
        call("Sandbox.set_network", sb.set_network, "public")
        call("Sandbox.set_secret", sb.set_secret, "TOKEN", vault="GH")
        call("Sandbox.remove_secret", sb.remove_secret, "TOKEN")
        call("Sandbox.logs", sb.logs, tail_bytes=100)
        call("Sandbox.snapshot", sb.snapshot, "snap2", force=True)
        call("Sandbox.fork", sb.fork, count=1)
        call("Sandbox.start_browser", sb.start_browser)
        call("Sandbox.browser_status", sb.browser_status)
        call("Sandbox.exec", sb.exec, ["sh", "-c", "true"], env={"A": "1"}, cwd="/", user="root", stdin=b"in",
             timeout_s=5, kill_on_disconnect=True, pids_limit=64)
        call("Sandbox.start", sb.start, ["sleep", "1"], env={"A": "1"}, stdin_open=True, timeout_s=5, pids_limit=64)
        call("Sandbox.attach", sb.attach, "b" * 20)
        self.srv.fail_next = "stream-error"
        with self.assertRaises(airlock.StreamBroken):
            sb.exec(["true"])
        call("Sandbox.list_execs", sb.list_execs)
        call("Sandbox.get_exec", sb.get_exec, "b" * 20)
        call("Sandbox.send_stdin", sb.send_stdin, "b" * 20, b"data", close=True)
        call("Sandbox.signal", sb.signal, "b" * 20, 15)
        call("Sandbox.write_file", sb.write_file, "/f", b"data", mode=0o600)
        call("Sandbox.read_file", sb.read_file, "/f")
        call("Sandbox.read_file_to", sb.read_file_to, "/f", io.BytesIO())
        call("Sandbox.list_files", sb.list_files, "/", depth=2)
        call("Sandbox.stat", sb.stat, "/f")
        call("Sandbox.mkdir", sb.mkdir, "/d", parents=True)
        call("Sandbox.rename", sb.rename, "/f", "/g")
        call("Sandbox.remove", sb.remove, "/d", recursive=True)
        call("Sandbox.write_archive", sb.write_archive, "/d", self.srv.RequestHandlerClass._tar())
        call("Sandbox.read_archive_to", sb.read_archive_to, "/d", io.BytesIO())
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "f"), "wb").close()
            call("Sandbox.upload_dir", sb.upload_dir, d, "/d")
        status: list[str] = []
        ex = call("Sandbox.run_code", sb.run_code, "1+1", language="python", timeout_s=5,
                  return_files=["*.png", "/tmp/*.svg"], on_status=status.append)
        # The spec's answer has one line of each type: a status line, and a
        # result line with every property (file included).
        self.assertEqual((status, ex.status), (["a" * 20], ["a" * 20]))
        self.assertEqual([(r.file, r["text/plain"]) for r in ex.results], [("a" * 20, "42")])
        call("Sandbox.run_code", sb.run_code, "1+1", context="ctx-1")
        call("Sandbox.create_context", sb.create_context, id="c1", language="python", cwd="/root", env={"A": "1"})
        call("Sandbox.list_contexts", sb.list_contexts)
        call("Sandbox.restart_context", sb.restart_context, "c1")
        call("Sandbox.interrupt_context", sb.interrupt_context, "c1")
        call("Sandbox.delete_context", sb.delete_context, "c1")
        call("Sandbox.kill", sb.kill)
        self.srv.fail_next = "error"
        with self.assertRaises(airlock.NotFound):
            c.get(sid)

        self.assertEqual(self.srv.errors, [], "requests the spec does not document")
        unread = sorted({k for k, present in Probe.log if not present})
        self.assertEqual(unread, [], "keys the SDK reads that the spec's answers do not have")

        public = set()
        for cls in (airlock.Client, airlock.Sandbox):
            for name, v in vars(cls).items():
                if not name.startswith("_") and (callable(v) or isinstance(v, property)):
                    public.add(f"{cls.__name__}.{name}")
        missing = sorted(public - run - set(NOT_RUN))
        self.assertEqual(missing, [], "public SDK methods this test does not run: run them here or add them to NOT_RUN")
        stale = sorted(set(NOT_RUN) - public)
        self.assertEqual(stale, [], "NOT_RUN names methods the SDK no longer has")


if __name__ == "__main__":
    unittest.main()
