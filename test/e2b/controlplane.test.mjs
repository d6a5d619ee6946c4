// Tests of airlock serve's E2B control-plane routes beyond the lifecycle
// (snapshots, create from a snapshot, fork, network update, metrics) with
// the official E2B SDK (`e2b` 2.51.0 on npm), unmodified, configured only
// through E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, against real
// sandboxes. Run through scripts/test-e2b.sh (needs AIRLOCK_TEST_STATE_DIR
// prepared by `airlock setup`, and AIRLOCK_BIN).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { airlock, sandboxState, startServe } from "./serve.mjs";

let server, url, key, otherKey;

before(async () => {
  server = await startServe("e2b-controlplane");
  ({ url, key, otherKey } = server);
});

after(() => server?.stop());

// A snapshot, a fork and a create from a snapshot save or restore a whole
// guest; under TCG on a small host that can outlast the SDK's default 60 s
// request timeout.
const slow = { requestTimeoutMs: 300_000 };

test("e2b 2.51.0: snapshots, create from a snapshot, fork, network update, metrics", { timeout: 900_000 }, async () => {
  const { Sandbox, SandboxError, SandboxNotFoundError } = await import("e2b");
  const name = `cp-${Date.now().toString(36)}`; // the state dir may keep earlier runs' snapshots
  const sbx = await Sandbox.create({ timeoutMs: 600_000 });
  const made = [sbx];
  let unnamed;
  try {
    await sbx.files.write("/root/state.txt", "before\n");

    // Snapshots: named, and with a generated name; the source runs on.
    const snap = await sbx.createSnapshot({ name, ...slow });
    assert.deepEqual(snap, { snapshotId: name, names: [name] });
    unnamed = (await sbx.createSnapshot(slow)).snapshotId;
    assert.match(unnamed, /^snap-[a-z2-7]{10}$/);
    assert.equal(sandboxState(sbx.sandboxId), "running", "the source keeps running");
    assert.equal((await sbx.commands.run("cat /root/state.txt")).stdout, "before\n");

    // Listed newest first, by source sandbox, by name, page by page.
    const mine = await sbx.listSnapshots().nextItems();
    assert.deepEqual(mine.map((s) => s.snapshotId), [unnamed, name]);
    assert.deepEqual((await Sandbox.listSnapshots({ name }).nextItems()).map((s) => s.snapshotId), [name]);
    const pages = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId, limit: 1 });
    const first = await pages.nextItems();
    assert.equal(pages.hasNext, true);
    const second = await pages.nextItems();
    assert.equal(pages.hasNext, false);
    assert.deepEqual([...first, ...second].map((s) => s.snapshotId), [unnamed, name]);

    // A sandbox from the snapshot has the file as it was.
    const restored = await Sandbox.create(name, { timeoutMs: 300_000, ...slow });
    made.push(restored);
    assert.notEqual(restored.sandboxId, sbx.sandboxId);
    assert.equal(await restored.files.read("/root/state.txt"), "before\n");

    // A fork is a running copy that then goes its own way.
    await sbx.files.write("/root/state.txt", "source\n");
    const forks = await sbx.fork({ timeoutMs: 120_000, ...slow });
    assert.equal(forks.length, 1);
    const [fork] = forks;
    assert.ok(fork instanceof Sandbox, `a fork, not an error: ${fork}`);
    made.push(fork);
    assert.notEqual(fork.sandboxId, sbx.sandboxId);
    assert.equal(await fork.files.read("/root/state.txt"), "source\n");
    await fork.files.write("/root/state.txt", "fork\n");
    assert.equal(await fork.files.read("/root/state.txt"), "fork\n");
    assert.equal(await sbx.files.read("/root/state.txt"), "source\n", "the source does not see the fork's writes");
    const left = (await fork.getInfo()).endAt.getTime() - Date.now();
    assert.ok(left > 60_000 && left <= 125_000, `the fork's own lifetime, about 120 s: ${left} ms`);

    // A snapshot that sandboxes use cannot go.
    await assert.rejects(Sandbox.deleteSnapshot(name), (e) => e instanceof SandboxError && /412/.test(e.message), "a snapshot in use");

    // The network changes while the sandbox runs: all traffic denied but
    // what allowOut names, as airlock's own `network get` shows; then back
    // to the internet. What airlock has no equivalent for is a 400.
    const net = () => JSON.parse(airlock("network", "get", "--json", sbx.sandboxId));
    await sbx.updateNetwork({ allowOut: ["example.com"], denyOut: ["0.0.0.0/0"] });
    let n = net();
    assert.equal(n.mode, "deny", JSON.stringify(n));
    assert.deepEqual(n.allow, ["example.com"]);
    await sbx.updateNetwork({ allowInternetAccess: true });
    n = net();
    assert.equal(n.mode ?? "public", "public", JSON.stringify(n));
    assert.ok(!n.allow?.length, JSON.stringify(n));
    await assert.rejects(sbx.updateNetwork({ denyOut: ["10.0.0.0/8"] }),
      (e) => e instanceof SandboxError && /400/.test(e.message) && /no deny list/.test(e.message));
    // Metrics: one sample of the guest's own account.
    const [m] = await sbx.getMetrics();
    assert.ok(m, "a sample");
    assert.ok(m.timestamp instanceof Date && Math.abs(m.timestamp.getTime() - Date.now()) < 60_000, `timestamp ${m.timestamp}`);
    assert.ok(m.cpuCount >= 1 && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpu ${m.cpuCount} ${m.cpuUsedPct}`);
    assert.ok(m.memTotal > 100 * 2 ** 20 && m.memUsed > 0 && m.memUsed < m.memTotal, `memory ${m.memUsed}/${m.memTotal}`);
    assert.ok(m.diskTotal > 2 ** 30 && m.diskUsed > 0 && m.diskUsed < m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`);

    // Another tenant sees none of it.
    const other = { apiKey: otherKey };
    const foreign = await Sandbox.listSnapshots(other).nextItems();
    assert.ok(!foreign.some((s) => [name, unnamed].includes(s.snapshotId)), `other tenant's list: ${JSON.stringify(foreign)}`);
    await assert.rejects(Sandbox.createSnapshot(sbx.sandboxId, other), SandboxNotFoundError);
    await assert.rejects(Sandbox.fork(sbx.sandboxId, other), SandboxNotFoundError);
    await assert.rejects(Sandbox.create(name, other), new RegExp(`404: template "${name}" not found`));
    await assert.rejects(Sandbox.updateNetwork(sbx.sandboxId, {}, other), SandboxNotFoundError);
    await assert.rejects(Sandbox.getMetrics(sbx.sandboxId, other), SandboxNotFoundError);
    assert.equal(await Sandbox.deleteSnapshot(name, other), false);
  } finally {
    for (const s of made) await s.kill();
  }
  // With its sandboxes gone, a snapshot can be deleted (the generated one
  // first: its disk is backed by the named one's); a second delete is false.
  assert.equal(await Sandbox.deleteSnapshot(unnamed), true);
  assert.equal(await Sandbox.deleteSnapshot(name), true);
  assert.equal(await Sandbox.deleteSnapshot(name), false);
  assert.deepEqual(await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems(), []);
});
