// Tests of airlock serve's E2B-compatible control plane with the official
// E2B SDK (`e2b` on npm), unmodified, configured only through E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY, against real sandboxes. Two SDK
// versions: 2.51.0 (v2 create and connect routes) and 2.45.0 (v1 routes,
// and the client-side check that keys look like e2b_<hex>).
// Run through scripts/test-e2b.sh (needs AIRLOCK_TEST_STATE_DIR prepared by
// `airlock setup`, and AIRLOCK_BIN).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import net from "node:net";

const BIN = process.env.AIRLOCK_BIN;
const STATE = process.env.AIRLOCK_TEST_STATE_DIR;
if (!BIN || !STATE) throw new Error("set AIRLOCK_BIN and AIRLOCK_TEST_STATE_DIR (see scripts/test-e2b.sh)");
const airlock = (...args) => execFileSync(BIN, ["--state-dir", STATE, ...args], { encoding: "utf8" });
const sandboxState = (id) => {
  const line = airlock("ls").split("\n").find((l) => l.startsWith(id));
  return line ? line.split(/\s+/)[1] : "gone";
};

let serve, url, key, otherKey;

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

before(async () => {
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  serve = spawn(BIN, ["--state-dir", STATE, "serve", "--listen", `127.0.0.1:${port}`], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((resolve, reject) => {
    serve.stdout.on("data", (d) => { if (String(d).includes("listening")) resolve(); });
    serve.on("exit", (code) => reject(new Error(`serve exited ${code}`)));
  });
  key = airlock("keys", "create", "--tenant", "e2b-sdk").trim();
  otherKey = airlock("keys", "create", "--tenant", "e2b-other").trim();
  assert.match(key, /^e2b_[0-9a-f]+$/, "keys pass the SDKs' client-side check");
  // The three variables of the issue, and nothing else.
  process.env.E2B_API_URL = url;
  process.env.E2B_SANDBOX_URL = url;
  process.env.E2B_API_KEY = key;
});

after(() => {
  serve?.kill("SIGTERM");
});

for (const [name, pkg] of [["2.51.0", "e2b"], ["2.45.0", "e2b-2-45"]]) {
  test(`e2b ${name}: create, info, list, timeout, pause, connect, kill`, { timeout: 600_000 }, async () => {
    const { Sandbox, SandboxNotFoundError, AuthenticationError } = await import(pkg);
    const sbx = await Sandbox.create({ metadata: { suite: `e2b-${name}` }, envs: { GREETING: "hi" }, timeoutMs: 120_000 });
    try {
      assert.match(sbx.sandboxId, /^[a-z0-9]+$/);
      assert.equal(sandboxState(sbx.sandboxId), "running", "a real sandbox runs behind the SDK's object");

      const info = await sbx.getInfo();
      assert.equal(info.sandboxId, sbx.sandboxId);
      assert.equal(info.state, "running");
      assert.equal(info.metadata.suite, `e2b-${name}`);
      assert.ok(info.endAt > info.startedAt, "the lifetime is set");
      const left = info.endAt.getTime() - Date.now();
      assert.ok(left > 60_000 && left <= 125_000, `about 120 s left, got ${left} ms`);

      const listed = await Sandbox.list({ query: { metadata: { suite: `e2b-${name}` } } }).nextItems();
      assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId]);

      await sbx.setTimeout(600_000);
      const later = await sbx.getInfo();
      assert.ok(later.endAt.getTime() - Date.now() > 500_000, "setTimeout moved the deadline");

      // Another tenant sees nothing of it.
      const foreign = await Sandbox.list({ apiKey: otherKey }).nextItems();
      assert.ok(!foreign.some((s) => s.sandboxId === sbx.sandboxId));
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: otherKey }), SandboxNotFoundError);

      // Pause (with memory) and connect, which resumes it.
      assert.equal(await sbx.pause(), true);
      assert.equal(sandboxState(sbx.sandboxId), "paused");
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "paused");
      const again = await Sandbox.connect(sbx.sandboxId);
      assert.equal(again.sandboxId, sbx.sandboxId);
      assert.equal(sandboxState(sbx.sandboxId), "running");

      // The in-sandbox API (envd) is not served yet, and says so.
      await assert.rejects(sbx.commands.run("echo hi"), /in-sandbox API/);

      // A bad key is an AuthenticationError.
      await assert.rejects(Sandbox.list({ apiKey: key.slice(0, -1) + (key.endsWith("0") ? "1" : "0") }).nextItems(), AuthenticationError);
    } finally {
      assert.equal(await sbx.kill(), true);
    }
    assert.equal(sandboxState(sbx.sandboxId), "gone");
    assert.equal(await Sandbox.kill(sbx.sandboxId), false, "killing a killed sandbox is false, not an error");
  });
}
