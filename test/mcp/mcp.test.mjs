// Tests of `airlock mcp` (stdio) and /mcp of `airlock serve` (streamable
// HTTP) with the official MCP TypeScript SDK against real sandboxes.
// Run through scripts/test-mcp.sh (needs AIRLOCK_TEST_STATE_DIR prepared
// by `airlock setup`, and AIRLOCK_BIN).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import net from "node:net";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const BIN = process.env.AIRLOCK_BIN;
const STATE = process.env.AIRLOCK_TEST_STATE_DIR;
if (!BIN || !STATE) throw new Error("set AIRLOCK_BIN and AIRLOCK_TEST_STATE_DIR (see scripts/test-mcp.sh)");
const airlock = (...args) => execFileSync(BIN, ["--state-dir", STATE, ...args], { encoding: "utf8" });
const TIMEOUT = { timeout: 300_000 };

const text = (res) => res.content.filter((c) => c.type === "text").map((c) => c.text).join("");
async function call(client, name, args = {}) {
  return client.callTool({ name, arguments: args }, undefined, TIMEOUT);
}
async function ok(client, name, args) {
  const res = await call(client, name, args);
  assert.ok(!res.isError, `${name}: ${text(res)}`);
  return res;
}
const sandboxExists = (id) => airlock("ls").includes(id);

async function newClient(transport) {
  const client = new Client({ name: "airlock-mcp-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

// exercise calls every tool on one session and returns the sandbox ids it
// created. Code contexts need the guest's context support (run_code's
// checks are the ones that fail without it).
async function exercise(client) {
  const tools = (await client.listTools()).tools.map((t) => t.name).sort();
  assert.deepEqual(tools, ["browser_click", "browser_download", "browser_eval", "browser_navigate", "browser_press",
    "browser_screenshot", "browser_scroll", "browser_snapshot", "browser_tab_close", "browser_tab_new", "browser_tab_switch",
    "browser_tabs", "browser_text", "browser_type", "context_create", "context_list", "context_reset", "exec", "file_list", "file_read",
    "file_write", "run_code", "sandbox_create", "sandbox_fork", "sandbox_kill", "sandbox_list", "sandbox_network_set",
    "sandbox_pause", "sandbox_resume", "sandbox_secret_remove", "sandbox_secret_set", "sandbox_set_timeout", "sandbox_snapshot"]);

  // exit 3 is reported as an error result with the streams.
  let res = await call(client, "exec", { cmd: ["sh", "-c", "echo out; echo err >&2; exit 3"] });
  assert.ok(res.isError);
  assert.match(text(res), /out/);
  assert.match(text(res), /err/);
  assert.match(text(res), /exit_code: 3/);
  const def = text(res).match(/sandbox_id: (\S+)/)[1];

  res = await ok(client, "sandbox_create", { cpus: 1, memory_mb: 512, timeout_s: 600, env: { FOO: "bar" }, metadata: { t: "mcp" }, network: "none" });
  const sb = JSON.parse(text(res));
  assert.equal(sb.state, "running");
  res = await call(client, "sandbox_create", { network: "open" });
  assert.ok(res.isError);
  assert.match(text(res), /network/);

  res = await ok(client, "exec", { sandbox_id: sb.id, cmd: ["sh", "-c", "echo $FOO $X; pwd"], env: { X: "y" }, cwd: "/tmp" });
  assert.match(text(res), /bar y/);
  assert.match(text(res), /\/tmp/);

  // The session's sandbox gets a new egress policy while it runs; "none"
  // cannot be set on a sandbox that exists.
  res = await ok(client, "sandbox_network_set", { sandbox_id: def, network: "deny", allow: ["example.com:443"] });
  const pol = JSON.parse(text(res));
  assert.equal(pol.network, "deny", text(res));
  assert.deepEqual(pol.allow, ["example.com:443"]);
  assert.equal(pol.applied, "running");
  res = await call(client, "sandbox_network_set", { sandbox_id: def, network: "none" });
  assert.ok(res.isError);
  assert.match(text(res), /none/);

  // The session's code sandbox has no browser: the manager says so.
  res = await call(client, "browser_tabs", { sandbox_id: def });
  assert.ok(res.isError, text(res));
  assert.match(text(res), /has no browser/);

  res = await ok(client, "sandbox_list");
  assert.ok(text(res).includes(sb.id) && text(res).includes(def));
  await ok(client, "sandbox_set_timeout", { sandbox_id: sb.id, timeout_s: 300 });

  // A paused sandbox resumes by itself on the next call, with its files.
  await ok(client, "exec", { sandbox_id: sb.id, cmd: ["sh", "-c", "echo kept > /tmp/paused.txt"] });
  res = await ok(client, "sandbox_pause", { sandbox_id: sb.id });
  assert.equal(JSON.parse(text(res)).sandbox.state, "paused");
  res = await ok(client, "exec", { sandbox_id: sb.id, cmd: ["cat", "/tmp/paused.txt"] });
  assert.match(text(res), /kept/);
  await ok(client, "sandbox_pause", { sandbox_id: sb.id });
  res = await ok(client, "sandbox_resume", { sandbox_id: sb.id });
  assert.equal(JSON.parse(text(res)).state, "running");

  const resources = (await client.listResources()).resources.map((r) => r.uri);
  assert.ok(resources.includes(`airlock://sandbox/${sb.id}`), `resources: ${resources}`);
  const rr = await client.readResource({ uri: `airlock://sandbox/${sb.id}` });
  assert.ok(rr.contents[0].text.includes(sb.id));

  await ok(client, "file_write", { path: "/tmp/mcp/hello.txt", content: "hello mcp\n" });
  res = await ok(client, "file_read", { path: "/tmp/mcp/hello.txt" });
  assert.equal(text(res), "hello mcp\n");
  await ok(client, "file_write", { path: "/tmp/mcp/bin.dat", content: Buffer.from([0, 1, 2, 255]).toString("base64"), encoding: "base64" });
  res = await ok(client, "file_read", { path: "/tmp/mcp/bin.dat" });
  assert.match(text(res), /AAEC\/w==/);
  res = await ok(client, "file_list", { path: "/tmp/mcp" });
  assert.match(text(res), /hello\.txt/);
  assert.match(text(res), /bin\.dat/);

  await ok(client, "sandbox_kill", { sandbox_id: sb.id });
  assert.ok(!sandboxExists(sb.id));

  // Code contexts (need the contexts work in the guest agent).
  res = await ok(client, "run_code", { code: "x = 6 * 7\nprint('hi')\nx" });
  assert.match(text(res), /hi/);
  assert.match(text(res), /42/);
  res = await call(client, "run_code", { code: "1/0" });
  assert.ok(res.isError);
  assert.match(text(res), /ZeroDivisionError/);
  res = await ok(client, "run_code", {
    code: "import base64,sys\nfrom IPython.display import Image, display\n" +
      "display(Image(data=base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')))",
  });
  assert.ok(res.content.some((c) => c.type === "image" && c.mimeType === "image/png"), "run_code returned no image");
  // Figures come back whatever backend the code picked (Agg shows
  // nothing), in later runs too, and return_files brings back the file the
  // code wrote (#21 item 3).
  res = await ok(client, "run_code", {
    code: "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.savefig('mcp-plot.png')",
    return_files: ["*.png"],
  });
  assert.equal(res.content.filter((c) => c.type === "image" && c.mimeType === "image/png").length, 2, text(res));
  assert.match(text(res), /--- file mcp-plot\.png \(an image\) ---/);
  res = await ok(client, "run_code", { code: "plt.plot([3, 2, 1])\nplt.show()" });
  assert.equal(res.content.filter((c) => c.type === "image").length, 1, `a later plt.show() under Agg: ${text(res)}`);
  await ok(client, "context_create", { id: "mcp-ctx", language: "python" });
  await ok(client, "run_code", { context: "mcp-ctx", code: "y = 1" });
  res = await ok(client, "context_list");
  assert.match(text(res), /mcp-ctx/);
  await ok(client, "context_reset", { context: "mcp-ctx" });
  res = await call(client, "run_code", { context: "mcp-ctx", code: "y" });
  assert.ok(res.isError, "y survived the reset");
  return [def];
}

test("stdio: every tool, and the session's sandboxes go with it", TIMEOUT, async () => {
  // The SDK's default environment, as a user's client config gets, and
  // the disk reserve make test sets (CI's filesystem is big and full).
  const env = getDefaultEnvironment();
  if (process.env.AIRLOCK_DISK_RESERVE) env.AIRLOCK_DISK_RESERVE = process.env.AIRLOCK_DISK_RESERVE;
  const transport = new StdioClientTransport({ command: BIN, args: ["--state-dir", STATE, "mcp"], env, stderr: "inherit" });
  const client = await newClient(transport);
  let ids = [];
  try {
    const res = await ok(client, "exec", { cmd: ["true"] });
    ids.push(text(res).match(/sandbox_id: (\S+)/)[1]);
    ids = ids.concat(await exercise(client));
  } finally {
    await client.close();
  }
  // The server removes the session's sandboxes after stdin closes.
  for (let i = 0; i < 600 && ids.some(sandboxExists); i++) await new Promise((r) => setTimeout(r, 100));
  for (const id of ids) assert.ok(!sandboxExists(id), `sandbox ${id} outlived its session`);
});

// The browser tools against Chromium in a sandbox of the browser image
// (built in the state dir: airlock image build browser), on gVisor
// (Chromium under QEMU without KVM is far too slow): a form served inside
// the sandbox is filled in by ref and sent.
const FORM = `<!doctype html><title>MCP form</title>
<h1>Sign up</h1>
<form id="f"><label>Name <input id="name"></label> <button type="submit">Send</button></form>
<p id="out">waiting</p>
<script>
document.getElementById("f").addEventListener("submit", (e) => {
  e.preventDefault();
  document.getElementById("out").textContent = "Hello, " + document.getElementById("name").value + "!";
});
</script>`;

test("stdio: browser tools (navigate, snapshot, type, click, screenshot) on gVisor", TIMEOUT, async () => {
  const transport = new StdioClientTransport({
    command: BIN, args: ["--state-dir", STATE, "mcp"], env: { ...process.env, AIRLOCK_RUNTIME: "gvisor" }, stderr: "inherit",
  });
  const client = await newClient(transport);
  let id;
  try {
    let res = await ok(client, "sandbox_create", { image: "browser", timeout_s: 900 });
    id = JSON.parse(text(res)).id;
    await ok(client, "file_write", { sandbox_id: id, path: "/srv/form.html", content: FORM });
    // The server runs on after the exec; the exec returns once it answers.
    await ok(client, "exec", {
      sandbox_id: id, cmd: ["bash", "-c", "cd /srv && setsid python3 -m http.server 8000 --directory /srv >/dev/null 2>&1 </dev/null & " +
        "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"],
    });

    res = await ok(client, "browser_navigate", { sandbox_id: id, url: "http://localhost:8000/form.html" });
    assert.match(text(res), /HTTP 200/);
    assert.match(text(res), /title: MCP form/);
    assert.match(text(res), new RegExp(`sandbox_id: ${id}`));

    res = await ok(client, "browser_snapshot", { sandbox_id: id });
    const snap = text(res);
    const ref = (re) => { const m = snap.match(re); assert.ok(m, `no ${re} in the snapshot:\n${snap}`); return m[1]; };
    const box = ref(/\[(e\d+)\] textbox "Name"/);
    const send = ref(/\[(e\d+)\] button "Send"/);
    assert.match(snap, /heading "Sign up" \[level=1\]/);

    await ok(client, "browser_type", { sandbox_id: id, ref: box, text: "Ada" });
    await ok(client, "browser_click", { sandbox_id: id, ref: send });
    res = await ok(client, "browser_text", { sandbox_id: id });
    assert.match(text(res), /Hello, Ada!/);
    res = await ok(client, "browser_eval", { sandbox_id: id, expression: "document.getElementById('out').textContent" });
    assert.match(text(res), /^"Hello, Ada!"/);
    res = await call(client, "browser_click", { sandbox_id: id, ref: "e999999" });
    assert.ok(res.isError);
    assert.match(text(res), /take a new browser_snapshot/);

    res = await ok(client, "browser_screenshot", { sandbox_id: id });
    const img = res.content.find((c) => c.type === "image");
    assert.ok(img, `no image in ${JSON.stringify(res.content.map((c) => c.type))}`);
    assert.equal(img.mimeType, "image/png");
    const png = Buffer.from(img.data, "base64");
    assert.ok(png.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), "not a PNG");
    assert.ok(png.length > 5000, `a ${png.length}-byte screenshot`);

    await ok(client, "sandbox_kill", { sandbox_id: id });
    assert.ok(!sandboxExists(id));
    id = undefined;
  } finally {
    if (id) try { airlock("rm", id); } catch {}
    await client.close();
  }
});

let serve, base, keyA, keyB;
async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}
before(async () => {
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  serve = spawn(BIN, ["--state-dir", STATE, "serve", "--listen", `127.0.0.1:${port}`], { stdio: ["ignore", "inherit", "inherit"] });
  for (let i = 0; i < 100; i++) {
    try { if ((await fetch(`${base}/healthz`)).ok) break; } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  const key = (t) => airlock("keys", "create", "--tenant", t).trim().split("\n").pop();
  keyA = key(`mcp-a-${process.pid}`);
  keyB = key(`mcp-b-${process.pid}`);
});
after(async () => {
  serve?.kill("SIGTERM");
  for (const k of [keyA, keyB]) if (k) try { airlock("keys", "revoke", k.split("_")[1]); } catch {}
});

const httpClient = (key) => newClient(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
}));

test("http: a request without a key is refused", async () => {
  const res = await fetch(`${base}/mcp`, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  assert.equal(res.status, 401);
});

test("http: tenants do not see each other; ending a session removes its sandboxes", TIMEOUT, async () => {
  const a = await httpClient(keyA);
  const b = await httpClient(keyB);
  const res = await ok(a, "sandbox_create", { timeout_s: 600 });
  const sb = JSON.parse(text(res));
  assert.ok(!text(await ok(b, "sandbox_list")).includes(sb.id), "tenant b sees tenant a's sandbox");
  assert.ok((await call(b, "sandbox_kill", { sandbox_id: sb.id })).isError);
  assert.ok((await call(b, "exec", { sandbox_id: sb.id, cmd: ["true"] })).isError);
  assert.ok((await call(b, "file_read", { sandbox_id: sb.id, path: "/etc/hostname" })).isError);
  assert.ok(text(await ok(a, "sandbox_list")).includes(sb.id));
  // Ending a's session (DELETE) removes its sandbox; b's session is unaffected.
  await a.transport.terminateSession();
  await a.close();
  for (let i = 0; i < 600 && sandboxExists(sb.id); i++) await new Promise((r) => setTimeout(r, 100));
  assert.ok(!sandboxExists(sb.id), "sandbox outlived its HTTP session");
  await ok(b, "sandbox_list");
  await b.close();
});

test("http: every tool", TIMEOUT, async () => {
  const c = await httpClient(keyA);
  let ids;
  try {
    ids = await exercise(c);
  } finally {
    await c.transport.terminateSession().catch(() => {});
    await c.close();
  }
  for (let i = 0; i < 600 && ids.some(sandboxExists); i++) await new Promise((r) => setTimeout(r, 100));
  for (const id of ids) assert.ok(!sandboxExists(id), `sandbox ${id} outlived its session`);
});
