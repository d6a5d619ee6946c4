"""Unit tests of the Python SDK against an in-memory fake server."""

import hashlib
import http.server
import io
import os
import tarfile
import tempfile
import threading
import time
import unittest

import _path  # noqa: F401  (sdk/python on sys.path)
import airlock
from fake_server import KEY, FakeServer


class FakeTestCase(unittest.TestCase):
    def setUp(self):
        self.fake = FakeServer().__enter__()
        self.addCleanup(self.fake.__exit__, None, None, None)
        self.client = airlock.Client(self.fake.url + "/", KEY, timeout=10)


class SandboxTests(FakeTestCase):
    def test_lifecycle(self):
        c = self.client
        sb = c.create(cpus=2, metadata={"team": "a"}, env={"A": "1"})
        self.assertEqual(sb.state, "running")
        self.assertEqual(sb.info["cpus"], 2)
        self.assertTrue(self.fake.last()["headers"]["User-Agent"].startswith("airlock-python/"))
        c.create()
        self.assertEqual(c.get(sb.id).id, sb.id)
        self.assertEqual(len(c.list(state="running")), 2)
        some = c.list(metadata={"team": "a"})
        self.assertEqual([s.id for s in some], [sb.id])
        self.assertEqual(self.fake.last()["query"]["metadata.team"], "a")
        sb.set_timeout(60)
        self.assertIn("expires_at", sb.info)
        sb.kill()
        with self.assertRaises(airlock.NotFound) as cm:
            c.get(sb.id)
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.request_id), (404, "not_found", "req-1"))

    def test_usage(self):
        c = self.client
        sb = c.create(cpus=2)
        u = sb.usage()
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/usage")
        self.assertEqual(self.fake.last()["method"], "GET")
        self.assertEqual((u["cpus"], u["cpu_seconds"], u["memory_bytes"], u["network"]["connections"]), (2, 1.5, 384 << 20, 2))
        self.assertNotIn("network", c.create(network="none").usage())
        sb.pause()
        with self.assertRaises(airlock.FailedPrecondition):
            c.usage(sb.id)
        self.assertEqual(c.get(sb.id).state, "paused")  # asking did not resume it

    def test_logs(self):
        sb = self.client.create()
        logs = sb.logs()
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/logs")
        self.assertEqual([(l["source"], l["text"], l["truncated"]) for l in logs], [("console", "boot\nready\n", False)])
        logs = sb.logs(tail_bytes=6)
        self.assertEqual(self.fake.last()["query"]["tail_bytes"], "6")
        self.assertEqual((logs[0]["text"], logs[0]["truncated"]), ("ready\n", True))

    def test_server(self):
        c = self.client
        c.create()
        o = c.server()
        self.assertEqual((self.fake.last()["method"], self.fake.last()["path"]), ("GET", "/v1/server"))
        self.assertEqual((o["admin"], o["sandboxes"]["running"], o["activity"]["failures"], o["runtime"]["name"]), (False, 1, [0, 0, 1], "qemu"))
        self.assertEqual(o["tenants"][0]["quota"]["max_vcpus"], 32)
        self.assertNotIn("host", o)

    def test_pause_resume_keepalive(self):
        c = self.client
        sb = c.create(idle_pause_s=300)
        self.assertEqual(sb.info["idle_pause_s"], 300)
        self.assertEqual(c.create().info["idle_pause_s"], 0)

        self.assertIs(sb.pause(), sb)
        self.assertEqual(sb.state, "paused")
        self.assertEqual(sb.info["pause"], {"state_bytes": 123 << 20, "save_ms": 800})
        self.assertEqual(sb.info["lifetime_left_s"], 600)
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/pause")
        again = c.pause(sb.id, force=True)  # a no-op
        self.assertEqual((again.state, again.info["pause"]["state_bytes"]), ("paused", 0))
        self.assertEqual([s.id for s in c.list(state="paused")], [sb.id])

        self.assertEqual(sb.resume().state, "running")
        self.assertNotIn("lifetime_left_s", sb.info)
        c.pause(sb.id)
        self.assertIsNone(sb.keepalive())
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/keepalive")
        self.assertEqual(c.get(sb.id).state, "running")  # a keepalive resumes, like any call
        self.assertEqual(c.resume(sb.id).state, "running")

        busy = c.create(metadata={"busy": "1"})
        with self.assertRaises(airlock.FailedPrecondition) as cm:
            busy.pause()
        self.assertEqual((cm.exception.status, cm.exception.code), (412, "failed_precondition"))
        self.assertEqual(busy.pause(force=True).state, "paused")
        with self.assertRaises(airlock.NotFound):
            c.resume("sbnope")

    def test_volumes(self):
        c = self.client
        v = c.create_volume("data", 64)
        self.assertEqual((v["name"], v["size_mb"], v["attachments"]), ("data", 64, []))
        self.assertEqual(self.fake.last()["json"], {"name": "data", "size_mb": 64})
        with self.assertRaises(airlock.Conflict):
            c.create_volume("data", 64)
        self.assertEqual([x["name"] for x in c.list_volumes()], ["data"])
        self.assertEqual(c.resize_volume("data", 128)["size_mb"], 128)
        with self.assertRaises(airlock.InvalidRequest):
            c.resize_volume("data", 32)

        sb = c.create(volumes=[{"name": "data", "path": "/data"}], mounts=[{"host_path": "/srv/src", "path": "/src"}])
        sent = self.fake.last()["json"]
        self.assertEqual(sent["volumes"], [{"name": "data", "path": "/data"}])
        self.assertEqual(sent["mounts"], [{"host_path": "/srv/src", "path": "/src"}])  # read-only: the server's default
        self.assertEqual(sb.mounts, [{"volume": "data", "path": "/data", "read_only": False},
                                     {"host_path": "/srv/src", "path": "/src", "read_only": True}])
        self.assertEqual(c.get_volume("data")["attachments"], [{"sandbox_id": sb.id, "path": "/data", "read_only": False}])
        with self.assertRaises(airlock.Conflict):
            c.create(volumes=[{"name": "data", "path": "/data", "read_only": True}])
        with self.assertRaises(airlock.Conflict):
            c.delete_volume("data")
        with self.assertRaises(airlock.NotFound):
            c.create(volumes=[{"name": "nope", "path": "/data"}])
        sb.kill()
        self.assertIsNone(c.delete_volume("data"))
        with self.assertRaises(airlock.NotFound):
            c.get_volume("data")
        self.assertEqual(c.create().mounts, [])

    def test_snapshot_and_fork(self):
        c = self.client
        sb = c.create(cpus=2)
        self.assertEqual((sb.info["source"], sb.info["disk_usage_bytes"]), ("", 3 << 20))
        sn = sb.snapshot("after-setup", force=True)
        self.assertEqual((sn["name"], sn["sandbox_id"], sn["cpus"], sn["size_bytes"]), ("after-setup", sb.id, 2, 64 << 20))
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/snapshot")
        with self.assertRaises(airlock.Conflict):
            c.snapshot(sb.id, "after-setup")
        self.assertEqual([s["name"] for s in c.list_snapshots()], ["after-setup"])
        self.assertEqual(c.get_snapshot("after-setup")["id"], sn["id"])
        with self.assertRaises(airlock.NotFound):
            c.get_snapshot("nope")

        # Only the snapshot's own fields are sent (no default image or size).
        from_sn = c.create(from_snapshot="after-setup", timeout_s=60)
        self.assertEqual((from_sn.info["source"], from_sn.info["cpus"]), ("snapshot:after-setup", 2))
        with self.assertRaises(airlock.FailedPrecondition):
            c.delete_snapshot("after-setup")
        from_sn.kill()
        self.assertIsNone(c.delete_snapshot("after-setup"))
        self.assertEqual(self.fake.last()["method"], "DELETE")
        with self.assertRaises(airlock.PermissionDenied):
            c.prune_snapshots()

        forks = sb.fork(3)
        self.assertEqual(len(forks), 3)
        self.assertEqual({f.info["source"] for f in forks}, {"fork:" + sb.id})
        self.assertEqual(len({f.id for f in forks} | {sb.id}), 4)
        with self.assertRaises(airlock.InvalidRequest):
            c.fork(sb.id, 17)
        with self.assertRaises(airlock.NotFound):
            c.fork("sbnope", 1)

    def test_browser(self):
        c = self.client
        plain = c.create()
        with self.assertRaises(airlock.FailedPrecondition):
            plain.start_browser()
        sb = c.create(image="browser")
        self.assertFalse(sb.browser_status()["running"])
        b = sb.start_browser(interactive=True, signed_ttl_s=120)
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/browser")
        self.assertTrue(b["running"])
        self.assertTrue(b["cdp_url"].endswith(f"/v1/sandboxes/{sb.id}/browser/cdp"))
        self.assertTrue(b["signed_cdp_url"].endswith("?token=t120"))
        self.assertTrue(b["vnc_url"].endswith("?interactive=1"))
        self.assertTrue(c.browser_status(sb.id)["running"])
        with self.assertRaises(airlock.InvalidRequest):
            c.start_browser(sb.id, signed_ttl_s=7200)

    def test_context_manager_kills(self):
        with self.client.create() as sb:
            sid = sb.id
        with self.assertRaises(airlock.NotFound):
            self.client.get(sid)
        # Killing one that is already gone is fine on exit.
        with self.client.create() as sb:
            sb.kill()

    def test_invalid_and_quota(self):
        with self.assertRaises(airlock.InvalidRequest):
            self.client.create(network="bridge")
        with self.assertRaises(airlock.QuotaExceeded) as cm:
            self.client.create(cpus=64)
        self.assertIn("cpus_per_tenant", cm.exception.message)

    def test_auth(self):
        self.client.list()
        self.assertEqual(self.fake.last()["headers"]["Authorization"], f"Bearer {KEY}")
        with self.assertRaises(airlock.Unauthenticated) as cm:
            airlock.Client(self.fake.url, "al_wrong").list()
        self.assertEqual(cm.exception.status, 401)
        self.assertIsInstance(cm.exception, airlock.AirlockError)

    def test_env_fallback(self):
        old = {k: os.environ.get(k) for k in ("AIRLOCK_HOST", "AIRLOCK_API_KEY")}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v) for k, v in old.items()])
        os.environ.pop("AIRLOCK_HOST", None)
        with self.assertRaises(ValueError):
            airlock.Client()
        os.environ["AIRLOCK_HOST"] = self.fake.url.removeprefix("http://")
        os.environ["AIRLOCK_API_KEY"] = KEY
        self.assertEqual(airlock.Client().list(), [])

    def test_events(self):
        c = self.client
        a, b = c.create(), c.create()
        a.write_file("/f", b"xyz")
        evs, nxt = c.events()
        self.assertEqual((len(evs), nxt), (3, 3))
        self.assertEqual(evs[2]["action"], "file.write")
        self.assertEqual(evs[2]["detail"]["size"], 3)
        evs, nxt = c.events(sandbox=b.id)
        self.assertEqual(([e["sandbox_id"] for e in evs], nxt), ([b.id], 2))
        evs, nxt = c.events(since=1, limit=1)
        self.assertEqual(([e["seq"] for e in evs], nxt), ([2], 2))
        evs, nxt = c.events(since=3)
        self.assertEqual((evs, nxt), ([], 3))


class ErrorDecodingTests(unittest.TestCase):
    def serve(self, status, body, ctype="application/json"):
        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self.send_response(status)
                self.send_header("X-Request-Id", "hdr")
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        fake = FakeServer(H).__enter__()
        self.addCleanup(fake.__exit__, None, None, None)
        return airlock.Client(fake.url, "k")

    def test_table(self):
        cases = [
            (400, b'{"error":{"code":"invalid","message":"cmd is required","request_id":"r1"}}',
             airlock.InvalidRequest, "invalid", "cmd is required", "r1"),
            (404, b'{"error":{"code":"not_found","message":"sandbox not found","request_id":"r2"}}',
             airlock.NotFound, "not_found", "sandbox not found", "r2"),
            (409, b'{"error":{"code":"conflict","message":"x","request_id":"r3"}}', airlock.Conflict, "conflict", "x", "r3"),
            (429, b'{"error":{"code":"resource_exhausted","message":"rate","request_id":"r4"}}',
             airlock.QuotaExceeded, "resource_exhausted", "rate", "r4"),
            (412, b'{"error":{"code":"failed_precondition","message":"stopping"}}',
             airlock.FailedPrecondition, "failed_precondition", "stopping", "hdr"),
            (422, b'{"error":{"code":"exec_not_started","message":"the exec did not start: x","request_id":"r6"}}',
             airlock.ExecNotStarted, "exec_not_started", "the exec did not start: x", "r6"),
            (507, b'{"error":{"code":"insufficient_storage","message":"short of disk","request_id":"r7"}}',
             airlock.InsufficientStorage, "insufficient_storage", "short of disk", "r7"),
            (502, b"<html>bad gateway</html>", airlock.AirlockError, "internal", "<html>bad gateway</html>", "hdr"),
            (503, b"", airlock.AirlockError, "unavailable", "Service Unavailable", "hdr"),
            (429, b"slow down", airlock.QuotaExceeded, "resource_exhausted", "slow down", "hdr"),
        ]
        for status, body, cls, code, msg, rid in cases:
            with self.subTest(status=status, body=body):
                with self.assertRaises(airlock.AirlockError) as cm:
                    self.serve(status, body).get("abc")
                e = cm.exception
                self.assertIs(type(e), cls)
                self.assertEqual((e.status, e.code, e.message, e.request_id), (status, code, msg, rid))
                self.assertIn(code, str(e))


class ExecTests(FakeTestCase):
    def setUp(self):
        super().setUp()
        self.sb = self.client.create(env={"A": "1"})

    def test_oom_killed(self):
        r = self.sb.exec(["balloon"])
        self.assertEqual((r.exit_code, r.signal, r.oom_killed), (-1, 9, True))
        self.assertFalse(r.ok)

    def test_bytes_round_trip(self):
        r = self.sb.exec(["bytes"])
        self.assertEqual(self.fake.last()["query"].get("encoding"), "base64")
        self.assertEqual(r.stdout, bytes(range(256)))
        self.assertEqual((r.exit_code, r.signal, r.timed_out, r.truncated, r.duration_ms), (0, 0, False, False, 7))
        self.assertFalse(r.oom_killed)
        self.assertTrue(r.ok)
        self.assertTrue(r.exec_id)
        data = b"\x00\xff\n\x80x"
        self.assertEqual(self.sb.exec(["cat"], stdin=data).stdout, data)
        self.assertEqual(self.sb.exec(["cat"], stdin="héllo").stdout, "héllo".encode())

    def test_exit_code_and_stderr(self):
        r = self.sb.exec(["fail", "3"])
        self.assertEqual((r.exit_code, r.stderr, r.stdout, r.ok), (3, b"boom", b"", False))

    def test_string_cmd_and_options(self):
        self.sb.exec("echo hi")
        self.assertEqual(self.fake.state.execs[self.sb.id]["ex00000000000001"].cmd, ["sh", "-c", "echo hi"])
        r = self.sb.exec(["env"], env={"B": "2"}, cwd="/tmp", user="nobody", timeout_s=5)
        self.assertEqual(r.stdout, b"A=1\nB=2\ncwd=/tmp user=nobody timeout=5\n")

    def test_pids_limit(self):
        r = self.sb.exec(["pids"])
        self.assertNotIn("pids_limit", self.fake.last()["json"])  # 0: the guest's default, not sent
        self.assertEqual(r.stdout, b"pids_limit=None\n")
        r = self.sb.exec(["pids"], pids_limit=64)
        self.assertEqual(self.fake.last()["json"]["pids_limit"], 64)
        self.assertEqual(r.stdout, b"pids_limit=64\n")
        eid = self.sb.start(["pids"], pids_limit=128)
        self.assertEqual(self.fake.last()["json"]["pids_limit"], 128)
        self.assertEqual(self.sb.attach(eid).stdout, b"pids_limit=128\n")
        with self.assertRaises(airlock.InvalidRequest):  # the server says what is wrong
            self.sb.exec(["pids"], pids_limit=-1)

    def test_callbacks(self):
        out, err = [], []
        r = self.sb.exec(["bytes"], on_stdout=out.append, on_stderr=err.append)
        self.assertEqual(b"".join(out), bytes(range(256)))
        self.assertEqual((r.stdout, err), (b"", []))

    def test_background(self):
        eid = self.sb.start(["cat"], stdin_open=True)
        info = self.sb.get_exec(eid)
        self.assertEqual((info["state"], info["exit"]), ("running", None))
        self.sb.send_stdin(eid, b"ab")
        self.sb.send_stdin(eid, "c\x00", close=True)
        r = self.sb.attach(eid)
        self.assertEqual((r.stdout, r.exit_code, r.exec_id), (b"abc\x00", 0, eid))
        execs = self.sb.list_execs()
        self.assertEqual([(e["exec_id"], e["state"]) for e in execs], [(eid, "exited")])
        with self.assertRaises(airlock.Conflict):
            self.sb.send_stdin(eid, b"x")
        eid2 = self.sb.start(["cat"], stdin_open=True)
        self.sb.signal(eid2, 9)
        self.assertEqual(self.sb.get_exec(eid2)["exit"]["signal"], 9)
        with self.assertRaises(airlock.NotFound):
            self.sb.get_exec("nope")

    def test_missing_sandbox(self):
        with self.assertRaises(airlock.NotFound):
            self.client.sandbox("nope").exec(["true"])


class StreamParsingTests(unittest.TestCase):
    def serve(self, *chunks):
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _go(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for c in chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                    self.wfile.flush()
                    time.sleep(0.005)
                self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = _go

        fake = FakeServer(H).__enter__()
        self.addCleanup(fake.__exit__, None, None, None)
        return airlock.Client(fake.url, "k").sandbox("sb")

    def test_split_lines_and_base64(self):
        sb = self.serve(
            b'{"type":"start","exec_id":"abcdefghabcdefgh","pid":7}\n{"type":"std',
            b'out","data":"aGVs', b'bG8K"}\n\n',
            b'{"type":"stderr","data":"AP8="}\n{"type":"future-kind","x":1}\n',
            b'{"type":"exit","code":-1,"signal":9,"timeout":true,"truncated":true,"duration_ms":1500}\n',
        )
        r = sb.exec(["x"])
        self.assertEqual(
            (r.exec_id, r.stdout, r.stderr, r.exit_code, r.signal, r.timed_out, r.truncated, r.duration_ms),
            ("abcdefghabcdefgh", b"hello\n", b"\x00\xff", -1, 9, True, True, 1500),
        )

    def test_missing_exit(self):
        sb = self.serve(b'{"type":"start","exec_id":"e2","pid":1}\n', b'{"type":"stdout","data":"aGk="}\n')
        got = []
        with self.assertRaises(airlock.StreamBroken) as cm:
            sb.exec(["x"], on_stdout=got.append)
        self.assertEqual((cm.exception.exec_id, got), ("e2", [b"hi"]))

    def test_server_stopping(self):
        sb = self.serve(
            b'{"type":"start","exec_id":"e5","pid":1}\n',
            b'{"type":"error","error":{"code":"unavailable","message":"the server is stopping; the exec goes on"}}\n',
        )
        with self.assertRaises(airlock.StreamBroken) as cm:
            sb.exec(["x"])
        self.assertEqual(cm.exception.exec_id, "e5")
        self.assertIn("the server is stopping", str(cm.exception))

    def test_sandbox_paused(self):
        sb = self.serve(
            b'{"type":"start","exec_id":"e6","pid":1}\n',
            b'{"type":"paused","exec_id":"e6","message":"the sandbox was paused; the exec goes on when it resumes"}\n',
            b'{"type":"exit","code":0}\n',
        )
        with self.assertRaises(airlock.ExecPaused) as cm:
            sb.exec(["x"])
        self.assertEqual((cm.exception.exec_id, cm.exception.code), ("e6", "exec_paused"))
        self.assertIsInstance(cm.exception, airlock.StreamBroken)
        self.assertIn("goes on when it resumes", str(cm.exception))

    def test_exit_cut_at_eof(self):
        with self.assertRaises(airlock.StreamBroken) as cm:
            self.serve(b'{"type":"exit","code":2}').attach("e1")
        self.assertEqual(cm.exception.exec_id, "e1")

    def test_bad_base64_and_json(self):
        with self.assertRaises(airlock.StreamBroken):
            self.serve(b'{"type":"stdout","data":"not base64!"}\n{"type":"exit","code":0}\n').attach("e")
        with self.assertRaises(airlock.StreamBroken):
            self.serve(b"{oops\n").attach("e")


class GatedReader(io.RawIOBase):
    """Yields `first`, then blocks until `release` is set, then yields `rest`."""

    def __init__(self, first, rest, release):
        self.parts, self.release, self.step = [first, rest], release, 0

    def readable(self):
        return True

    def read(self, n=-1):
        self.step += 1
        if self.step == 1:
            return self.parts[0]
        if self.step == 2:
            if not self.release.wait(10):
                raise RuntimeError("the server never saw the first chunk: the upload is buffered, not streamed")
            return self.parts[1]
        return b""


class FileTests(FakeTestCase):
    def setUp(self):
        super().setUp()
        self.sb = self.client.create()

    def test_write_streams(self):
        r = GatedReader(b"first chunk;", b"rest", self.fake.state.upload_started)
        self.assertEqual(self.sb.write_file("/tmp/a.txt", r), 16)
        self.assertEqual(self.fake.last()["headers"].get("Transfer-Encoding"), "chunked")
        self.assertFalse(r.closed, "write_file closed the caller's file")
        self.assertEqual(self.sb.read_file("/tmp/a.txt"), b"first chunk;rest")

    def test_write_generator_and_large_read_to(self):
        blob = os.urandom(3 * 1024 * 1024 + 7)
        gen = (blob[i : i + 100_000] for i in range(0, len(blob), 100_000))
        self.assertEqual(self.sb.write_file("/big", gen), len(blob))
        out = io.BytesIO()
        self.assertEqual(self.sb.read_file_to("/big", out), len(blob))
        self.assertEqual(hashlib.sha256(out.getvalue()).digest(), hashlib.sha256(blob).digest())

    def test_files(self):
        sb = self.sb
        sb.mkdir("/srv")
        self.assertEqual(sb.write_file("/srv/x", b"hello", mode=0o600), 5)
        last = self.fake.last()
        self.assertEqual((last["query"]["mode"], last["headers"].get("Content-Length")), ("0600", "5"))
        self.assertEqual(sb.write_file("/srv/s", "text"), 4)
        st = sb.stat("/srv/x")
        self.assertEqual((st["size"], st["type"], st["name"]), (5, "file", "x"))
        fl = sb.list_files("/srv")
        self.assertEqual((sorted(e["name"] for e in fl), fl.truncated), (["s", "x"], False))
        sb.rename("/srv/x", "/srv/y")
        self.assertEqual(self.fake.last()["path"], f"/v1/sandboxes/{sb.id}/files/rename")
        with self.assertRaises(airlock.NotFound):
            sb.stat("/srv/x")
        self.assertEqual(sb.read_file("/srv/y"), b"hello")
        sb.rename("/srv/y", "/srv/x")
        sb.remove("/srv/x")
        with self.assertRaises(airlock.NotFound):
            sb.stat("/srv/x")
        with self.assertRaises(airlock.NotFound):
            sb.read_file("/srv/x")
        with self.assertRaises(airlock.InvalidRequest):
            sb.write_file("relative", b"x")
        with self.assertRaises(airlock.InvalidRequest):
            sb.write_file("relative", io.BytesIO(b"x" * 200_000))
        odd = "/srv/a b&c=d?.txt"
        sb.write_file(odd, b"q")
        self.assertEqual(sb.read_file(odd), b"q")


# tarfile's extraction filters (PEP 706) arrived in Python 3.11.4; Debian 12's
# python3 is 3.11.2 without them, and there download_dir refuses to run.
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


class ArchiveTests(FakeTestCase):
    def setUp(self):
        super().setUp()
        self.sb = self.client.create()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def _tree(self, root):
        os.makedirs(os.path.join(root, "sub"))
        with open(os.path.join(root, "a.txt"), "wb") as f:
            f.write(b"alpha")
        os.chmod(os.path.join(root, "a.txt"), 0o640)
        with open(os.path.join(root, "sub", "run.sh"), "wb") as f:
            f.write(b"#!/bin/sh\n")
        os.chmod(os.path.join(root, "sub", "run.sh"), 0o755)
        os.symlink("sub/run.sh", os.path.join(root, "link"))
        os.mkfifo(os.path.join(root, "fifo"))

    def test_upload_then_download(self):
        src = os.path.join(self.tmp.name, "src")
        self._tree(src)
        out = self.sb.upload_dir(src, "/srv/app")
        self.assertEqual(out["path"], "/srv/app")
        last = self.fake.last()
        self.assertEqual(last["headers"].get("Content-Type"), "application/x-tar")
        self.assertEqual(last["headers"].get("Transfer-Encoding"), "chunked")
        with tarfile.open(fileobj=io.BytesIO(self.fake.state.archives[self.sb.id]["/srv/app"])) as tar:
            names = {m.name: m for m in tar.getmembers()}
        self.assertEqual(sorted(names), ["a.txt", "link", "sub", "sub/run.sh"])  # no fifo
        self.assertEqual((names["a.txt"].mode, names["link"].linkname), (0o640, "sub/run.sh"))

        dst = os.path.join(self.tmp.name, "dst")
        if HAS_DATA_FILTER:
            self.sb.download_dir("/srv/app", dst)
            with open(os.path.join(dst, "a.txt"), "rb") as f:
                self.assertEqual(f.read(), b"alpha")
            self.assertEqual(os.stat(os.path.join(dst, "sub", "run.sh")).st_mode & 0o777, 0o755)
            self.assertEqual(os.readlink(os.path.join(dst, "link")), "sub/run.sh")
        else:
            with self.assertRaisesRegex(RuntimeError, "data filter"):
                self.sb.download_dir("/srv/app", dst)
            self.assertFalse(os.path.lexists(dst))
        buf = io.BytesIO()
        self.assertGreater(self.sb.read_archive_to("/srv/app", buf), 0)
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
            self.assertTrue(all(n == "app" or n.startswith("app/") for n in tar.getnames()))

        with self.assertRaises(airlock.InvalidRequest):
            self.sb.write_archive("relative", b"")
        if HAS_DATA_FILTER:
            with self.assertRaises(airlock.NotFound):
                self.sb.download_dir("/nope", os.path.join(self.tmp.name, "none"))

    def _hostile(self, *members):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, typ, link in members:
                ti = tarfile.TarInfo(name)
                ti.type, ti.linkname = typ, link
                data = b"pwned" if typ == tarfile.REGTYPE else b""
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
        return out.getvalue()

    def test_download_refuses_hostile_archives(self):
        cases = {
            "dotdot": [("app/../../escape", tarfile.REGTYPE, "")],
            "absolute": [("/tmp/airlock-py-escape", tarfile.REGTYPE, "")],
            "symlink then file": [("app/up", tarfile.SYMTYPE, ".."), ("app/up/escape", tarfile.REGTYPE, "")],
            "absolute symlink": [("app/etc", tarfile.SYMTYPE, "/etc")],
            "hard link out": [("app/h", tarfile.LNKTYPE, "canary")],
            "device": [("app/null", tarfile.CHRTYPE, "")],
            "not under app": [("other", tarfile.REGTYPE, "")],
        }
        for name, members in cases.items():
            with self.subTest(name):
                root = tempfile.mkdtemp(dir=self.tmp.name)
                with open(os.path.join(root, "canary"), "wb") as f:
                    f.write(b"canary")
                self.fake.state.archive_out = self._hostile(*members)
                dest = os.path.join(root, "dest")
                if not HAS_DATA_FILTER:
                    with self.assertRaisesRegex(RuntimeError, "data filter"):
                        self.sb.download_dir("/srv/app", dest)
                    self.assertEqual(sorted(os.listdir(root)), ["canary"])
                    continue
                with self.assertRaises(tarfile.TarError):
                    self.sb.download_dir("/srv/app", dest)
                outside = sorted(os.listdir(root))
                self.assertEqual(outside, ["canary", "dest"])
                with open(os.path.join(root, "canary"), "rb") as f:
                    self.assertEqual(f.read(), b"canary")
                self.assertFalse(os.path.lexists("/tmp/airlock-py-escape"))
                for dirpath, _, files in os.walk(dest):
                    for fn in files:
                        with open(os.path.join(dirpath, fn), "rb") as f:
                            self.assertNotEqual(f.read(), b"canary")


class LiveAgainstFakeTests(FakeTestCase):
    """Runs the live test's body against the fake, so the unit tier covers it."""

    def test_live_body(self):
        import test_live

        test_live.run_live(self, self.client)


if __name__ == "__main__":
    unittest.main()
