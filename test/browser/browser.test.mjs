// Tests of a browser sandbox's DevTools endpoint on `airlock serve` with
// unmodified Playwright (playwright-core) and Puppeteer (puppeteer-core),
// and of `airlock browser cdp`. Run through scripts/test-browser.sh (needs
// AIRLOCK_TEST_STATE_DIR prepared by `airlock setup --browser`, and
// AIRLOCK_BIN). The sandboxes run on gVisor unless AIRLOCK_RUNTIME says
// otherwise (make test says auto: gVisor without KVM, where Chromium under
// QEMU takes minutes; the Go e2e suite's TestBrowser covers both runtimes
// where KVM runs QEMU's).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import http from "node:http";
import { chromium } from "playwright-core";
import puppeteer from "puppeteer-core";
import WebSocket from "ws";

process.env.AIRLOCK_RUNTIME ||= "gvisor";
const { startServe, BIN } = await import("../e2b/serve.mjs");

const FORM = `<!doctype html>
<title>airlock form</title>
<form id="f"><label>Name <input id="name"></label> <button id="go" type="submit">Greet</button></form>
<p id="out"></p>
<script>
document.getElementById("f").addEventListener("submit", (e) => {
  e.preventDefault();
  document.getElementById("out").textContent = "hello " + document.getElementById("name").value;
});
</script>`;

let srv, id;
const remote = (key, ...args) =>
  execFileSync(BIN, args, { encoding: "utf8", env: { ...process.env, AIRLOCK_HOST: srv.url, AIRLOCK_API_KEY: key } });
const cdp = () => `${srv.url}/v1/sandboxes/${id}/browser/cdp`;
const bearer = (key) => ({ Authorization: `Bearer ${key}` });

before(async () => {
  srv = await startServe("browser-e2e");
  id = remote(srv.key, "create", "--image", "browser", "--timeout", "20m").trim();
  // The page the browser loads is served inside the sandbox, on its own
  // loopback: nothing leaves the machine.
  remote(srv.key, "exec", id, "--", "bash", "-c", `mkdir -p /srv && cat > /srv/form.html <<'EOF'\n${FORM}\nEOF`);
  remote(srv.key, "exec", id, "--", "bash", "-c", "nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv >/tmp/http.log 2>&1 &");
});

after(() => {
  if (id) remote(srv.key, "rm", id);
  srv?.stop();
});

// fillForm drives the form page through a Playwright or Puppeteer page.
async function fillForm(page, name) {
  await page.goto("http://localhost:8000/form.html");
  await page.type("#name", name);
  await page.click("#go");
  await page.waitForFunction(`document.getElementById("out").textContent === ${JSON.stringify(`hello ${name}`)}`);
  return page.evaluate(() => document.getElementById("out").textContent);
}

test("the endpoint refuses a request without the key, with another tenant's key, and a bad signed token", async () => {
  let res = await fetch(`${cdp()}/json/version`);
  assert.equal(res.status, 401);
  res = await fetch(`${cdp()}/json/version`, { headers: bearer(srv.otherKey) });
  assert.equal(res.status, 404);
  res = await fetch(`${cdp()}?token=${"x".repeat(40)}.${"y".repeat(43)}`);
  assert.equal(res.status, 401);
  await assert.rejects(chromium.connectOverCDP(cdp(), { timeout: 60_000 }), /401|Unauthorized|unauthenticated/i);
});

test("/json/version points back at the server", async () => {
  const res = await fetch(`${cdp()}/json/version`, { headers: bearer(srv.key) });
  assert.equal(res.status, 200);
  const v = await res.json();
  assert.match(v.Browser, /^(Headless)?Chrome\/\d+/);
  assert.equal(v.webSocketDebuggerUrl, cdp().replace("http://", "ws://"));
});

test("Playwright connectOverCDP with the key: a form, a click, a screenshot, a script", async () => {
  const browser = await chromium.connectOverCDP(cdp(), { headers: bearer(srv.key), timeout: 120_000 });
  try {
    const context = browser.contexts()[0];
    assert.ok(context, "the running browser has a default context");
    const page = await context.newPage();
    assert.equal(await fillForm(page, "playwright"), "hello playwright");
    assert.equal(await page.title(), "airlock form");
    const png = await page.screenshot();
    assert.ok(png.length > 1000, `screenshot of ${png.length} bytes`);
    assert.equal(png.subarray(1, 4).toString(), "PNG");
    assert.equal(await page.evaluate(() => 6 * 7), 42);
    await page.close();
  } finally {
    await browser.close(); // a CDP connection: disconnects, the browser goes on
  }
  const st = JSON.parse(remote(srv.key, "browser", "status", id, "--json"));
  assert.equal(st.running, true, "the browser outlives a client's close");
});

test("Puppeteer connect with the signed URL", async () => {
  const res = await fetch(`${srv.url}/v1/sandboxes/${id}/browser`, {
    method: "POST", headers: { ...bearer(srv.key), "Content-Type": "application/json" }, body: JSON.stringify({ ttl_s: 120 }),
  });
  assert.equal(res.status, 200);
  const info = await res.json();
  assert.equal(info.running, true);
  assert.match(info.signed_cdp_url, /^ws:\/\/.*\/browser\/cdp\?token=/);
  assert.ok(Date.parse(info.signed_expires_at) - Date.now() <= 121_000);
  // The token is for this sandbox only.
  const other = remote(srv.key, "create", "--timeout", "5m").trim();
  try {
    const wrong = info.signed_cdp_url.replace(`/sandboxes/${id}/`, `/sandboxes/${other}/`).replace("ws://", "http://");
    assert.equal((await fetch(wrong)).status, 401);
  } finally {
    remote(srv.key, "rm", other);
  }
  const browser = await puppeteer.connect({ browserWSEndpoint: info.signed_cdp_url, protocolTimeout: 120_000 });
  try {
    const page = await browser.newPage();
    assert.equal(await fillForm(page, "puppeteer"), "hello puppeteer");
    await page.close();
  } finally {
    await browser.disconnect();
  }
});

// previewGet GETs url from the server with its host as the Host header
// (preview hosts live under localhost:<port>: no DNS needed).
function previewGet(url) {
  const u = new URL(url);
  const srvURL = new URL(srv.url);
  return new Promise((resolve, reject) => {
    http.get({ host: srvURL.hostname, port: srvURL.port, path: u.pathname + u.search, headers: { Host: u.host } }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body }));
    }).on("error", reject);
  });
}

// firstMessage opens a WebSocket and resolves with its first message, or
// rejects with the handshake's refusal.
function firstMessage(url, headers) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, ["binary"], { headers });
    ws.on("message", (m) => { resolve(Buffer.from(m)); ws.close(); });
    ws.on("unexpected-response", (_req, res) => reject(new Error(`status ${res.statusCode}`)));
    ws.on("error", reject);
  });
}

test("the live view: noVNC on the sandbox's preview host, the VNC stream through the API", async () => {
  const res = await fetch(`${srv.url}/v1/sandboxes/${id}/browser`, {
    method: "POST", headers: { ...bearer(srv.key), "Content-Type": "application/json" }, body: JSON.stringify({ view: true }),
  });
  assert.equal(res.status, 200);
  const info = await res.json();
  assert.equal(info.view_port, 6080);
  assert.match(info.view_url, new RegExp(`^http://6080-${id}\\.localhost:\\d+/vnc\\.html\\?`));
  assert.match(info.view_url, /view_only=1/);
  // The page (the guest's noVNC) comes through the preview host with the
  // token in the URL (redirected into a cookie), never from the API's origin.
  let page = await previewGet(info.view_url);
  assert.equal(page.status, 302, page.body);
  const cookie = page.headers["set-cookie"][0].split(";")[0];
  page = await new Promise((resolve, reject) => {
    const u = new URL(info.view_url);
    const srvURL = new URL(srv.url);
    http.get({ host: srvURL.hostname, port: srvURL.port, path: "/vnc.html", headers: { Host: u.host, Cookie: cookie } }, (r) => {
      let body = "";
      r.on("data", (d) => (body += d));
      r.on("end", () => resolve({ status: r.statusCode, body }));
    }).on("error", reject);
  });
  assert.equal(page.status, 200);
  assert.match(page.body, /noVNC/);
  // The stream: the RFB handshake of x11vnc, through websockify.
  const banner = await firstMessage(info.vnc_url, bearer(srv.key));
  assert.match(banner.toString(), /^RFB 003\.00\d\n/);
  await assert.rejects(firstMessage(info.vnc_url, {}), /status 401/);
  await assert.rejects(firstMessage(info.vnc_url, bearer(srv.otherKey)), /status 404/);
});

test("airlock browser cdp serves the endpoint on a loopback port under a random path", async () => {
  const proc = spawn(BIN, ["browser", "cdp", id], { env: { ...process.env, AIRLOCK_HOST: srv.url, AIRLOCK_API_KEY: srv.key }, stdio: ["ignore", "pipe", "inherit"] });
  try {
    const lines = await new Promise((resolve, reject) => {
      let out = "";
      proc.stdout.on("data", (d) => {
        out += d;
        const l = out.split("\n");
        if (l.length >= 3) resolve(l);
      });
      proc.on("exit", (code) => reject(new Error(`airlock browser cdp exited ${code}`)));
    });
    const [ws, http] = lines;
    assert.match(ws, /^ws:\/\/127\.0\.0\.1:\d+\/[a-z0-9]{26}$/);
    assert.equal(http, ws.replace("ws://", "http://"));
    const root = new URL(http);
    assert.equal((await fetch(`${root.origin}/json/version`)).status, 404, "the path is the secret");
    const browser = await chromium.connectOverCDP(http, { timeout: 120_000 });
    try {
      const page = await browser.contexts()[0].newPage();
      assert.equal(await fillForm(page, "local"), "hello local");
      await page.close();
    } finally {
      await browser.close();
    }
  } finally {
    proc.kill("SIGTERM");
  }
});
