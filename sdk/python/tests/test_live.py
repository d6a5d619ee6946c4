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


class LiveTests(unittest.TestCase):
    def test_live_sandbox(self):
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
        run_live(self, airlock.Client(host, key, timeout=300))


if __name__ == "__main__":
    unittest.main()
