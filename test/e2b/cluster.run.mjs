// Run by test/e2e's TestClusterE2BSDK against a cluster's control tier
// (`airlock serve --cluster`), with the official E2B SDK, unmodified and
// configured only through E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
// (the test points the two URLs at different replicas), plus
// E2B_OTHER_KEY, another tenant's key. Not a *.test.mjs: the single-host
// suite (scripts/test-e2b.sh) does not run it. It prints the sandbox's id
// on its last line.
import assert from "node:assert/strict";
import { Sandbox } from "e2b";

const other = process.env.E2B_OTHER_KEY;
if (!process.env.E2B_API_URL || !process.env.E2B_SANDBOX_URL || !process.env.E2B_API_KEY || !other) {
  throw new Error("set E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_OTHER_KEY");
}
const suite = `cluster-${process.pid}`;
const sbx = await Sandbox.create({ metadata: { suite }, envs: { GREETING: "hi-cluster" }, timeoutMs: 300_000 });
try {
  const info = await sbx.getInfo();
  assert.equal(info.state, "running");
  assert.equal(info.metadata.suite, suite);

  // envd through the other replica: commands and files.
  const r = await sbx.commands.run("echo $GREETING");
  assert.equal(r.stdout, "hi-cluster\n");
  assert.equal(r.exitCode, 0);
  await assert.rejects(sbx.commands.run("exit 3"), (e) => e.exitCode === 3);
  await sbx.files.write("/tmp/c.txt", "through the cluster");
  assert.equal(await sbx.files.read("/tmp/c.txt"), "through the cluster");

  const listed = await Sandbox.list({ query: { metadata: { suite } } }).nextItems();
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId]);
  await sbx.setTimeout(600_000);
  assert.ok((await sbx.getInfo()).endAt.getTime() - Date.now() > 500_000, "setTimeout moved the deadline");

  // Another tenant sees nothing of it.
  const foreign = await Sandbox.list({ apiKey: other }).nextItems();
  assert.ok(!foreign.some((s) => s.sandboxId === sbx.sandboxId));
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: other }));

  // Pause (through the node's export) and connect, which resumes it with
  // its files.
  assert.equal(await sbx.pause(), true);
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "paused");
  const again = await Sandbox.connect(sbx.sandboxId);
  assert.equal((await again.commands.run("cat /tmp/c.txt")).stdout, "through the cluster");

  // What stays on one node says so, in E2B's error shape.
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes/${sbx.sandboxId}/fork`, { method: "POST", headers: { "X-API-Key": process.env.E2B_API_KEY } });
  assert.equal(res.status, 501);
  assert.match((await res.json()).message, /forks are not served by the cluster's control tier/);
} finally {
  await sbx.kill();
}
assert.deepEqual(await Sandbox.list({ query: { metadata: { suite } } }).nextItems(), []);
console.log(sbx.sandboxId);
