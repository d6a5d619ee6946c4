"""Network options, event types and preview URLs of the Python SDK."""

import json
import unittest

import _path  # noqa: F401  (sdk/python on sys.path)
import airlock
from fake_server import KEY, FakeServer


class NetworkTests(unittest.TestCase):
    def setUp(self):
        self.fake = FakeServer().__enter__()
        self.addCleanup(self.fake.__exit__, None, None, None)
        self.client = airlock.Client(self.fake.url + "/", KEY, timeout=10)

    def test_create_with_network(self):
        sb = self.client.create(network={
            "mode": "deny",
            "allow": ["api.github.com", "140.82.112.0/20:443"],
            "secrets": [{"name": "OPENAI_API_KEY", "hosts": ["api.openai.com"], "value": "sk-test"}],
            "rate_bytes": 1 << 20,
            "max_conns": 64,
        })
        n = sb.network
        self.assertEqual((n["mode"], n["allow"], n["rate_bytes"], n["max_conns"]),
                         ("deny", ["api.github.com", "140.82.112.0/20:443"], 1 << 20, 64))
        sec = n["secrets"][0]
        self.assertEqual((sec["name"], sec["hosts"]), ("OPENAI_API_KEY", ["api.openai.com"]))
        self.assertTrue(sec["placeholder"].startswith("airlock-secret-"))
        self.assertNotIn("sk-test", json.dumps(sb.info))
        self.assertNotIn("sk-test", json.dumps(self.client.get(sb.id).info))

    def test_network_mode_and_default(self):
        self.assertEqual(self.client.create(network="none").network["mode"], "none")
        self.assertEqual(self.client.create().network["mode"], "public")
        with self.assertRaises(airlock.InvalidRequest):
            self.client.create(network={"secrets": [{"name": "K", "hosts": ["a.example"]}]})
        with self.assertRaises(airlock.PermissionDenied) as cm:
            self.client.create(network={"ports": [{"host_port": 8080, "guest_port": 8000}]})
        self.assertEqual(cm.exception.status, 403)

    def test_set_network(self):
        sb = self.client.create(network="deny")
        out = sb.set_network(allow=["pypi.org", "files.pythonhosted.org:443"])
        self.assertEqual((out["applied"], out["network"]["mode"], out["network"]["allow"]),
                         ("running", "deny", ["pypi.org", "files.pythonhosted.org:443"]))
        self.assertEqual(sb.network["allow"], ["pypi.org", "files.pythonhosted.org:443"])
        self.assertEqual(self.fake.last()["method"], "PUT")
        self.assertEqual(self.client.get_network(sb.id)["mode"], "deny")
        self.assertEqual(self.client.set_network(sb.id, "public")["network"]["mode"], "public")
        with self.assertRaises(airlock.PermissionDenied):
            sb.set_network(allow=["10.0.0.1"])
        with self.assertRaises(airlock.InvalidRequest):
            sb.set_network("none")
        with self.assertRaises(airlock.NotFound):
            self.client.set_network("nosuchsandboxaaaaaaa", "public")

    def test_events_type(self):
        sb = self.client.create()
        with self.fake.state.lock:
            self.fake.state.event(sb.id, "net.deny", {"host": "example.org"})
            self.fake.state.event(sb.id, "net.secret.inject", {"name": "K"})
        evs, _ = self.client.events(sandbox=sb.id, type="net")
        self.assertEqual([e["action"] for e in evs], ["net.deny", "net.secret.inject"])
        self.assertEqual(self.fake.last()["query"]["type"], "net")

    def test_port_url(self):
        sb = self.client.create()
        self.assertEqual(sb.port_url(8000), f"{self.fake.url}/v1/sandboxes/{sb.id}/ports/8000/")
        c = airlock.Client("https://[::1]:7443/api/", KEY)
        self.assertEqual(c.port_url("abc", 80), "https://[::1]:7443/api/v1/sandboxes/abc/ports/80/")


if __name__ == "__main__":
    unittest.main()
