"""The vault and live secrets of the Python SDK."""

import json
import unittest

import _path  # noqa: F401  (sdk/python on sys.path)
import airlock
from fake_server import KEY, FakeServer


class SecretTests(unittest.TestCase):
    def setUp(self):
        self.fake = FakeServer().__enter__()
        self.addCleanup(self.fake.__exit__, None, None, None)
        self.client = airlock.Client(self.fake.url + "/", KEY, timeout=10)

    def sent(self, method, path):
        return [r for r in self.fake.state.requests if r["method"] == method and r["path"] == path]

    def test_vault(self):
        v = self.client.set_vault_secret("GH", "ghp-python-value", hosts=["api.github.com"])
        self.assertEqual((v["name"], v["hosts"]), ("GH", ["api.github.com"]))
        self.assertNotIn("ghp-python-value", json.dumps(v))
        self.assertEqual(self.sent("PUT", "/v1/secrets/GH")[0]["json"], {"value": "ghp-python-value", "hosts": ["api.github.com"]})
        listed = self.client.list_vault_secrets()
        self.assertEqual([s["name"] for s in listed], ["GH"])
        self.assertNotIn("ghp-python-value", json.dumps(listed))
        self.client.delete_vault_secret("GH")
        self.assertEqual(self.client.list_vault_secrets(), [])
        with self.assertRaises(airlock.NotFound):
            self.client.delete_vault_secret("GH")
        with self.assertRaises(airlock.InvalidRequest):
            self.client.set_vault_secret("GH", "")

    def test_create_with_vault_secret(self):
        self.client.set_vault_secret("GH", "ghp-python-value", hosts=["api.github.com"])
        sb = self.client.create(network={"secrets": [{"name": "GITHUB_TOKEN", "vault": "GH"}]})
        sec = sb.network["secrets"][0]
        self.assertEqual((sec["name"], sec["vault"]), ("GITHUB_TOKEN", "GH"))
        sent = self.sent("POST", "/v1/sandboxes")[-1]["json"]
        self.assertEqual(sent["network"]["secrets"], [{"name": "GITHUB_TOKEN", "vault": "GH"}])

    def test_live_secrets(self):
        self.client.set_vault_secret("GH", "ghp-python-value", hosts=["api.github.com"])
        sb = self.client.create()
        out = sb.set_secret("GITHUB_TOKEN", vault="GH")
        self.assertEqual(out["applied"], "running")
        self.assertEqual(sb.info["network"]["secrets"][0]["hosts"], ["api.github.com"])
        self.assertEqual(self.sent("PUT", f"/v1/sandboxes/{sb.id}/secrets/GITHUB_TOKEN")[0]["json"], {"vault": "GH"})
        self.client.set_sandbox_secret(sb.id, "OTHER", value="v-123", hosts=["a.example"])
        self.assertEqual(self.sent("PUT", f"/v1/sandboxes/{sb.id}/secrets/OTHER")[0]["json"],
                         {"hosts": ["a.example"], "value": "v-123"})
        out = sb.remove_secret("OTHER")
        self.assertEqual((out["closed"], [s["name"] for s in sb.info["network"]["secrets"]]), (1, ["GITHUB_TOKEN"]))
        with self.assertRaises(airlock.NotFound):
            sb.remove_secret("OTHER")
        with self.assertRaises(ValueError):
            sb.set_secret("X", value="v", vault="GH")
        with self.assertRaises(airlock.InvalidRequest):
            sb.set_secret("X", vault="NOPE")


if __name__ == "__main__":
    unittest.main()
