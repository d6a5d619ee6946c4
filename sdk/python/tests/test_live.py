"""Live tier: the SDK against a real `airlock serve`.

Skips unless AIRLOCK_TEST_API and AIRLOCK_TEST_API_KEY are set; fails when
AIRLOCK_TEST_VM=1 asked for real guests but the API is not configured, so the
tier cannot vanish silently from `make test`.
"""

import hashlib
import io
import os
import unittest

import _path  # noqa: F401  (sdk/python on sys.path)
import airlock


def run_live(tc: unittest.TestCase, client: airlock.Client) -> None:
    with client.create(timeout_s=300, metadata={"test": "sdk-python"}) as sb:
        tc.assertEqual(sb.state, "running", sb.info.get("reason"))
        r = sb.exec(["python3", "-c", "print(6*7)"])
        tc.assertEqual((r.stdout, r.exit_code), (b"42\n", 0), r.stderr)

        blob = os.urandom(5 * 1024 * 1024)
        want = hashlib.sha256(blob).hexdigest()
        tc.assertEqual(sb.write_file("/tmp/blob", io.BytesIO(blob)), len(blob))
        out = io.BytesIO()
        tc.assertEqual(sb.read_file_to("/tmp/blob", out), len(blob))
        tc.assertEqual(hashlib.sha256(out.getvalue()).hexdigest(), want)
        r = sb.exec(["sha256sum", "/tmp/blob"])
        tc.assertEqual(r.stdout[:64].decode(), want)

        sb.run_code("x = 21")  # a code context keeps state between calls
        tc.assertEqual(sb.run_code("x * 2").text, "42")
        tc.assertEqual(sb.run_code("1/0").error.name, "ZeroDivisionError")
        sid = sb.id
    # The context manager killed it: gone, or at most still stopping.
    try:
        tc.assertEqual(client.get(sid).state, "stopping")
    except airlock.NotFound:
        pass


def run_terminal(tc: unittest.TestCase, sb: airlock.Sandbox) -> None:
    """A terminal: its size, a resize, typed input with its echo, the exit
    code; then a kept terminal re-attached by exec id."""
    script = "stty size; read a; stty size; read b; echo got:$b; exit 7"
    with sb.terminal(["sh", "-c", script], rows=30, cols=100) as t:
        tc.assertTrue(t.exec_id)
        seen = bytearray()

        def until(want: bytes) -> None:
            while want not in seen:
                chunk = t.read(timeout=60)
                tc.assertTrue(chunk, f"the terminal ended before {want!r}: {bytes(seen)!r}")
                seen.extend(chunk)

        until(b"30 100")
        t.resize(40, 120)
        t.send("\n")
        until(b"40 120")
        t.send("hello\n")
        r = t.wait(timeout=60)
        tc.assertIn(b"got:hello", bytes(seen) + r.stdout)
        tc.assertEqual(r.exit_code, 7)
    # keep=True: the command outlives the socket; exec_id re-attaches.
    t = sb.terminal(["sh", "-c", "echo first; read x; echo second:$x"], keep=True)
    eid = t.exec_id
    tc.assertIn(b"first", t.read(timeout=60))
    t.close()
    with sb.terminal(exec_id=eid) as t2:
        tc.assertEqual(t2.exec_id, eid)
        t2.send("again\n")
        r = t2.wait(timeout=60)
        tc.assertIn(b"second:again", r.stdout)
        tc.assertEqual(r.exit_code, 0)


class LiveTests(unittest.TestCase):
    def client(self) -> airlock.Client:
        host, key = os.environ.get("AIRLOCK_TEST_API"), os.environ.get("AIRLOCK_TEST_API_KEY")
        if not host or not key:
            if os.environ.get("AIRLOCK_TEST_VM") == "1":
                self.fail(
                    "AIRLOCK_TEST_VM=1 but AIRLOCK_TEST_API and AIRLOCK_TEST_API_KEY are not both set: "
                    "start `airlock serve` and export its URL and an API key"
                )
            self.skipTest(
                "live SDK tier: set AIRLOCK_TEST_API=http://HOST:PORT and AIRLOCK_TEST_API_KEY "
                "to test against `airlock serve`"
            )
        return airlock.Client(host, key, timeout=300)

    def test_live_sandbox(self):
        run_live(self, self.client())

    def test_live_terminal(self):
        # Needs websocket-client (python3-websocket, installed by scripts/deps.sh
        # for Debian's python3, which scripts/test-sdk.sh runs): an ImportError
        # here fails the test rather than skipping it.
        with self.client().create(timeout_s=300, metadata={"test": "sdk-python-terminal"}) as sb:
            run_terminal(self, sb)


if __name__ == "__main__":
    unittest.main()
