// Tests of airlock serve's E2B-compatible control plane with the official
// E2B SDK (`e2b` on npm), unmodified, configured only through E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY, against real sandboxes. Two SDK
// versions: 2.51.0 (v2 create and connect routes) and 2.45.0 (v1 routes,
// and the client-side check that keys look like e2b_<hex>). In-sandbox
// calls (envd: commands and files) go to the same server, told apart by the
// SDK's E2b-Sandbox-Id header and authorized by the sandbox's access token.
// Run through scripts/test-e2b.sh (needs AIRLOCK_TEST_STATE_DIR prepared by
// `airlock setup`, and AIRLOCK_BIN).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { airlock, sandboxState, startServe } from "./serve.mjs";

let server, url, key, otherKey;

before(async () => {
  server = await startServe("e2b-sdk");
  ({ url, key, otherKey } = server);
  assert.match(key, /^e2b_[0-9a-f]+$/, "keys pass the SDKs' client-side check");
});

after(() => server?.stop());

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

      // The resumed sandbox answers in-sandbox calls.
      assert.equal((await again.commands.run("echo $GREETING")).stdout, "hi\n");
      assert.equal(await again.isRunning(), true);

      // A bad key is an AuthenticationError.
      await assert.rejects(Sandbox.list({ apiKey: key.slice(0, -1) + (key.endsWith("0") ? "1" : "0") }).nextItems(), AuthenticationError);
    } finally {
      assert.equal(await sbx.kill(), true);
    }
    assert.equal(sandboxState(sbx.sandboxId), "gone");
    assert.equal(await Sandbox.kill(sbx.sandboxId), false, "killing a killed sandbox is false, not an error");
  });
}

for (const [name, pkg] of [["2.51.0", "e2b"], ["2.45.0", "e2b-2-45"]]) {
  test(`e2b ${name}: commands`, { timeout: 600_000 }, async () => {
    const { Sandbox, CommandExitError } = await import(pkg);
    const sbx = await Sandbox.create({ envs: { GREETING: "hi" }, timeoutMs: 300_000 });
    try {
      // Foreground: stdout, stderr, the sandbox's envs, the request's envs
      // and cwd, exit codes.
      let r = await sbx.commands.run("echo $GREETING $X; pwd; echo oops >&2", { envs: { X: "there" }, cwd: "/tmp" });
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "hi there\n/tmp\n");
      assert.equal(r.stderr, "oops\n");
      assert.equal((await sbx.commands.run("pwd")).stdout, "/root\n", "a command starts in the user's home");
      const failed = await sbx.commands.run("echo partial; exit 3").catch((e) => e);
      assert.ok(failed instanceof CommandExitError, `exit 3 throws CommandExitError, got ${failed}`);
      assert.equal(failed.exitCode, 3);
      assert.equal(failed.stdout, "partial\n");

      // Background, with output streamed to callbacks as it comes.
      const seen = [];
      const h = await sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", { background: true, onStdout: (d) => seen.push(d) });
      assert.ok(h.pid > 0);
      const done = await h.wait();
      assert.equal(done.stdout, "1\n2\n3\n");
      assert.equal(seen.join(""), "1\n2\n3\n");
      assert.ok(seen.length >= 2, `output arrived in pieces, as it was written: ${JSON.stringify(seen)}`);

      // List and kill a running process; killing it again is false.
      const sleeper = await sbx.commands.run("sleep 120", { background: true });
      const procs = await sbx.commands.list();
      assert.ok(procs.some((p) => p.pid === sleeper.pid), `list has ${sleeper.pid}: ${JSON.stringify(procs)}`);
      assert.equal(await sbx.commands.kill(sleeper.pid), true);
      const killed = await sleeper.wait().catch((e) => e);
      assert.ok(killed instanceof CommandExitError, `a killed command's wait throws, got ${killed}`);
      assert.equal(killed.exitCode, -1);
      assert.equal(await sbx.commands.kill(sleeper.pid), false);

      // stdin: send, then close.
      const cat = await sbx.commands.run("cat", { background: true, stdin: true });
      await sbx.commands.sendStdin(cat.pid, "hello stdin\n");
      if (typeof sbx.commands.closeStdin === "function") {
        await sbx.commands.closeStdin(cat.pid);
      } else {
        await sbx.commands.kill(cat.pid);
      }
      const catOut = await cat.wait().catch((e) => e);
      assert.equal(catOut.stdout, "hello stdin\n");

      // Connect to a running process from a second handle.
      const ticker = await sbx.commands.run("sleep 1; echo late", { background: true });
      const attached = await sbx.commands.connect(ticker.pid);
      assert.equal((await attached.wait()).stdout, "late\n");
    } finally {
      await sbx.kill();
    }
    // A dead sandbox's calls fail (E2B's 502) instead of hanging.
    await assert.rejects(sbx.commands.run("true"));
    assert.equal(await sbx.isRunning(), false);
  });

  test(`e2b ${name}: files`, { timeout: 600_000 }, async () => {
    const { Sandbox, FileNotFoundError, NotFoundError } = await import(pkg);
    const sbx = await Sandbox.create({ timeoutMs: 300_000 });
    try {
      await sbx.files.write("/tmp/e2b/hello.txt", "hello files");
      assert.equal(await sbx.files.read("/tmp/e2b/hello.txt"), "hello files");
      assert.equal((await sbx.commands.run("cat /tmp/e2b/hello.txt")).stdout, "hello files", "the file is in the guest");

      // 5 MB of binary, byte for byte.
      const big = new Uint8Array(5 * 1024 * 1024);
      for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 11)) & 0xff;
      await sbx.files.write("/tmp/e2b/big.bin", big.buffer);
      const back = await sbx.files.read("/tmp/e2b/big.bin", { format: "bytes" });
      assert.equal(back.length, big.length);
      assert.ok(Buffer.from(back).equals(Buffer.from(big)), "5 MB read back equal");

      // Several files in one write; list, exists, getInfo, rename, remove.
      const infos = await sbx.files.write([{ path: "/tmp/e2b/m/a.txt", data: "A" }, { path: "/tmp/e2b/m/b.txt", data: "B" }]);
      assert.deepEqual(infos.map((i) => i.path).sort(), ["/tmp/e2b/m/a.txt", "/tmp/e2b/m/b.txt"]);
      const entries = await sbx.files.list("/tmp/e2b/m");
      assert.deepEqual(entries.map((e) => [e.name, e.type]).sort(), [["a.txt", "file"], ["b.txt", "file"]]);
      assert.equal(await sbx.files.exists("/tmp/e2b/m/a.txt"), true);
      assert.equal(await sbx.files.exists("/tmp/e2b/m/nope"), false);
      const info = await sbx.files.getInfo("/tmp/e2b/big.bin");
      assert.equal(info.size, big.length);
      assert.equal(info.type, "file");
      const moved = await sbx.files.rename("/tmp/e2b/m/a.txt", "/tmp/e2b/m/c.txt");
      assert.equal(moved.path, "/tmp/e2b/m/c.txt");
      assert.equal(await sbx.files.read("/tmp/e2b/m/c.txt"), "A");
      await sbx.files.remove("/tmp/e2b/m");
      assert.equal(await sbx.files.exists("/tmp/e2b/m/c.txt"), false);
      assert.equal(await sbx.files.makeDir("/tmp/e2b/d/e"), true);
      assert.equal(await sbx.files.makeDir("/tmp/e2b/d/e"), false, "an existing directory is false");
      assert.equal((await sbx.files.getInfo("/tmp/e2b/d/e")).type, "dir");

      // watchDir: changes under a directory, new subdirectories included.
      const seen = [];
      const watch = await sbx.files.watchDir("/tmp/e2b", (e) => seen.push(`${e.type} ${e.name}`), { recursive: true });
      await sbx.files.write("/tmp/e2b/w/new.txt", "x");
      await sbx.commands.run("echo more >> /tmp/e2b/w/new.txt && rm /tmp/e2b/hello.txt.bak 2>/dev/null; touch /tmp/e2b/gone && rm /tmp/e2b/gone");
      const until = Date.now() + 30_000;
      const want = ["create w", "create w/new.txt", "write w/new.txt", "remove gone"];
      while (!want.every((w) => seen.includes(w)) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      await watch.stop();
      for (const w of want) assert.ok(seen.includes(w), `watchDir saw "${w}": ${JSON.stringify(seen)}`);

      // A missing file is the SDK's not-found error.
      const missing = await sbx.files.read("/tmp/e2b/none").catch((e) => e);
      assert.ok(missing instanceof (FileNotFoundError ?? NotFoundError), `missing file: ${missing}`);

      // Signed URLs work without the SDK: plain fetch, no headers.
      if (typeof sbx.downloadUrl === "function") {
        const res = await fetch(await sbx.downloadUrl("/tmp/e2b/hello.txt"));
        assert.equal(res.status, 200);
        assert.equal(await res.text(), "hello files");
        const form = new FormData();
        form.append("file", new Blob(["uploaded"]), "/tmp/e2b/up.txt");
        const up = await fetch(await sbx.uploadUrl("/tmp/e2b/up.txt"), { method: "POST", body: form });
        assert.equal(up.status, 200, await up.clone().text());
        assert.equal(await sbx.files.read("/tmp/e2b/up.txt"), "uploaded");
        const unsigned = await fetch(`${url}/files?path=/tmp/e2b/hello.txt`);
        assert.equal(unsigned.status, 401);
      }
    } finally {
      await sbx.kill();
    }
  });
}

test("@e2b/code-interpreter 2.8.0: runCode, state, plots, errors, contexts", { timeout: 600_000 }, async () => {
  const { Sandbox } = await import("@e2b/code-interpreter");
  const sbx = await Sandbox.create({ timeoutMs: 300_000 });
  try {
    // State survives between runs; the last expression is the main result.
    await sbx.runCode("x = 21");
    const seen = [];
    const ex = await sbx.runCode("print('hello from python')\nx * 2", { onStdout: (m) => seen.push(m.line ?? m) });
    assert.equal(ex.text, "42");
    assert.deepEqual(ex.logs.stdout, ["hello from python\n"]);
    assert.equal(seen.length, 1, "onStdout was called");
    assert.ok(ex.executionCount >= 2, `execution count ${ex.executionCount}`);

    // A matplotlib figure comes back as a PNG.
    const plot = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()");
    const png = plot.results.find((r) => r.png);
    assert.ok(png, `a PNG result: ${JSON.stringify(plot.results.map((r) => r.formats()))}`);
    assert.equal(Buffer.from(png.png, "base64").subarray(1, 4).toString(), "PNG");

    // An exception is the execution's error, not a thrown one.
    const err = await sbx.runCode("1/0");
    assert.equal(err.error.name, "ZeroDivisionError");
    assert.match(err.error.value, /division by zero/);
    assert.ok(err.error.traceback.length > 0);

    // Contexts: their own state; listed; removed.
    const ctx = await sbx.createCodeContext({ language: "python", cwd: "/tmp" });
    assert.ok(ctx.id);
    await sbx.runCode("y = 'in ctx'", { context: ctx });
    assert.equal((await sbx.runCode("import os; os.getcwd()", { context: ctx })).text, "/tmp", "a string result without its quotes, as E2B gives it");
    const missing = await sbx.runCode("y", {});
    assert.equal(missing.error?.name, "NameError", "the default context does not see the other's state");
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
    await sbx.removeCodeContext(ctx);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));

    // Bash works as a language.
    assert.match((await sbx.runCode("echo from bash", { language: "bash" })).logs.stdout.join(""), /from bash/);
  } finally {
    await sbx.kill();
  }
});

test("e2b 2.51.0: pty (a terminal: create, type, resize, connect, kill)", { timeout: 600_000 }, async () => {
  const { Sandbox } = await import("e2b");
  const sbx = await Sandbox.create({ timeoutMs: 300_000 });
  try {
    let screen = "";
    const decoder = new TextDecoder();
    const waitFor = async (re, what) => {
      const deadline = Date.now() + 60_000;
      while (!re.test(screen)) {
        if (Date.now() > deadline) throw new Error(`no ${what} on the terminal: ${JSON.stringify(screen.slice(-500))}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    const term = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => { screen += decoder.decode(d, { stream: true }); }, timeoutMs: 0 });
    assert.ok(term.pid > 0);
    const type = (s) => sbx.pty.sendInput(term.pid, new TextEncoder().encode(s));
    await type("tty; stty size; echo \"TERM=$TERM\"\n");
    await waitFor(/\/dev\/pts\/\d+/, "tty");
    await waitFor(/30 100/, "the size asked");
    await waitFor(/TERM=xterm-256color/, "TERM");
    await sbx.pty.resize(term.pid, { cols: 120, rows: 40 });
    await type("stty size\n");
    await waitFor(/40 120/, "the new size");
    // A second client joins the same terminal and sees what is typed next.
    let other = "";
    const joined = await sbx.pty.connect(term.pid, { onData: (d) => { other += decoder.decode(d); } });
    await type("echo joined-$((6*7))\n");
    await waitFor(/joined-42/, "the command's output");
    const deadline = Date.now() + 30_000;
    while (!/joined-42/.test(other) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.match(other, /joined-42/, "the connected client sees the output too");
    assert.equal(await sbx.pty.kill(term.pid), true);
    const end = await term.wait().catch((e) => e);
    assert.equal(end.exitCode, -1, `a killed terminal's exit: ${end}`);
    await joined.wait().catch(() => {});
    assert.equal(await sbx.pty.kill(term.pid), false);
  } finally {
    await sbx.kill();
  }
});

// httpGet fetches path from the server with Host set (a preview host).
function httpGet(host, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = http.get({ host: u.hostname, port: u.port, path, headers: { Host: host, ...headers } }, (res) => {
      let body = "";
      res.on("data", (d) => { body += d; });
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on("error", reject);
  });
}

test("e2b 2.51.0: getHost (a guest port on its preview host)", { timeout: 600_000 }, async () => {
  const { Sandbox } = await import("e2b");
  const sbx = await Sandbox.create({ timeoutMs: 300_000 });
  try {
    await sbx.files.write("/tmp/site/index.html", "hello from the guest\n");
    await sbx.commands.run("cd /tmp/site && exec python3 -m http.server 8000", { background: true, timeoutMs: 0 });
    const host = sbx.getHost(8000);
    assert.equal(host, `8000-${sbx.sandboxId}.localhost:${new URL(url).port}`);
    assert.ok(sbx.trafficAccessToken, "create returned a traffic token");
    let r;
    const until = Date.now() + 60_000;
    do {
      r = await httpGet(host, "/index.html", { "e2b-traffic-access-token": sbx.trafficAccessToken });
      if (r.status !== 200) await new Promise((res) => setTimeout(res, 200));
    } while (r.status !== 200 && Date.now() < until);
    assert.equal(r.status, 200, r.body);
    assert.equal(r.body, "hello from the guest\n");
    assert.equal((await httpGet(host, "/index.html")).status, 401, "without the token");
    assert.equal((await httpGet(host, "/index.html", { "e2b-traffic-access-token": "x" })).status, 401, "with a wrong token");
  } finally {
    await sbx.kill();
  }
});

test("e2b 2.51.0: egress on create (deny all with exceptions) and refusals", { timeout: 600_000 }, async () => {
  const { Sandbox, ALL_TRAFFIC } = await import("e2b");
  const sbx = await Sandbox.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ["example.com", "1.1.1.1"] }, timeoutMs: 120_000 });
  try {
    const net = JSON.parse(airlock("inspect", sbx.sandboxId)).network;
    assert.equal(net.mode, "deny", JSON.stringify(net));
    assert.deepEqual(net.allow, ["example.com", "1.1.1.1"]);
    assert.equal((await sbx.getInfo()).allowInternetAccess, false);
  } finally {
    await sbx.kill();
  }
  // What airlock does not do is refused, never ignored.
  await assert.rejects(Sandbox.create({ lifecycle: { onTimeout: "pause" } }), /onTimeout 'pause'/);
  await assert.rejects(Sandbox.create({ network: { denyOut: ["10.0.0.0/8"] } }), /has no deny list/);
});
