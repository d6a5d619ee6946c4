// The server page: GET /v1/server every 10 s while the page is visible.
// The server decides what the key may see (a tenant: its own figures; an
// admin: every tenant, the host, why the runtime was picked); tenant names
// are shown as text.
"use strict";

(() => {
  const { api, el, setStatus } = airlock;
  const status = document.getElementById("srv-status");
  const states = document.getElementById("states");
  const svg = document.querySelector("#activity svg");
  const summary = document.getElementById("act-summary");
  const actBody = document.querySelector("#act-table tbody");
  const tenants = document.querySelector("#tenants tbody");
  const host = document.getElementById("host");
  const NS = "http://www.w3.org/2000/svg";
  const order = ["running", "creating", "resuming", "pausing", "paused", "stopping", "failed"];

  function bytes(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(n < 10 ? 1 : 0) : String(n)) + " " + u[i];
  }

  function mib(n) { return n >= 1024 ? (n / 1024).toFixed(n < 10240 ? 1 : 0) + " GiB" : n + " MiB"; }

  // used makes a cell of use against a quota: text and a meter; note
  // follows the text.
  function used(u, max, fmt, note) {
    const td = el("td", null, { class: "quota" });
    const f = fmt || String;
    if (!max) {
      td.append(f(u) + " (no quota)" + (note || ""));
      return td;
    }
    const text = f(u) + " of " + f(max) + (note || "");
    const m = el("meter", null, { min: "0", max: String(max), value: String(Math.min(u, max)), low: String(max * 0.7), high: String(max * 0.9), optimum: "0", "aria-label": text });
    td.append(el("span", text), m);
    if (u >= max) td.classList.add("full");
    return td;
  }

  function renderStates(s) {
    const items = order.filter((k) => k in s).map((k) => {
      const li = el("li", null, { "data-state": k, class: "state-" + k });
      li.append(el("span", String(s[k]), { class: "n" }), el("span", k, { class: "k" }));
      return li;
    });
    states.replaceChildren(...items);
  }

  function renderActivity(a) {
    const n = (a.creates || []).length;
    const max = Math.max(1, ...a.creates, ...a.failures);
    const w = 720 / Math.max(n, 1);
    const kids = [];
    for (let i = 0; i < n; i++) {
      const c = a.creates[i], f = a.failures[i];
      const hc = (c / max) * 110, hf = (f / max) * 110;
      const r1 = document.createElementNS(NS, "rect");
      r1.setAttribute("class", "create");
      r1.setAttribute("x", (i * w + 2).toFixed(1));
      r1.setAttribute("width", (w / 2 - 2).toFixed(1));
      r1.setAttribute("y", (118 - hc).toFixed(1));
      r1.setAttribute("height", hc.toFixed(1));
      const r2 = document.createElementNS(NS, "rect");
      r2.setAttribute("class", "fail");
      r2.setAttribute("x", (i * w + w / 2).toFixed(1));
      r2.setAttribute("width", (w / 2 - 2).toFixed(1));
      r2.setAttribute("y", (118 - hf).toFixed(1));
      r2.setAttribute("height", hf.toFixed(1));
      kids.push(r1, r2);
    }
    const axis = document.createElementNS(NS, "line");
    axis.setAttribute("class", "axis");
    axis.setAttribute("x1", "0"); axis.setAttribute("x2", "720"); axis.setAttribute("y1", "118.5"); axis.setAttribute("y2", "118.5");
    kids.push(axis);
    svg.replaceChildren(...kids);
    const since = Date.parse(a.since), step = a.bucket_s * 1000;
    const sum = (v) => v.reduce((x, y) => x + y, 0);
    const created = sum(a.creates), failed = sum(a.failures);
    let busiest = 0;
    for (let i = 1; i < n; i++) if (a.creates[i] > a.creates[busiest]) busiest = i;
    summary.textContent = created + " created and " + failed + " failed since " + new Date(since).toLocaleString() +
      (created ? "; most creates (" + a.creates[busiest] + ") in the hour from " + new Date(since + busiest * step).toLocaleTimeString() : "") +
      ". Blue: created; red: failed (a boot that failed, a crash, an out-of-memory kill).";
    svg.dataset.created = String(created);
    svg.dataset.failed = String(failed);
    const rows = [];
    for (let i = n - 1; i >= 0; i--) {
      if (!a.creates[i] && !a.failures[i]) continue;
      const tr = el("tr");
      tr.append(el("td", new Date(since + i * step).toLocaleString()), el("td", String(a.creates[i]), { class: "num" }), el("td", String(a.failures[i]), { class: "num" }));
      rows.push(tr);
    }
    if (!rows.length) {
      const tr = el("tr");
      tr.append(el("td", "nothing in the last 24 hours", { colspan: "3", class: "muted" }));
      rows.push(tr);
    }
    actBody.replaceChildren(...rows);
  }

  function renderTenants(list) {
    const rows = list.map((t) => {
      const q = t.quota || {};
      const tr = el("tr", null, { "data-tenant": t.tenant });
      tr.append(el("th", t.tenant === "" ? "(local user)" : t.tenant, { scope: "row", class: "mono" }),
        used(t.sandboxes, q.max_sandboxes), used(t.vcpus, q.max_vcpus), used(t.memory_mb, q.max_memory_mb, mib),
        used(t.disk_mb, q.max_disk_mb, mib), used(t.snapshots, q.max_snapshots, String, t.snapshots_disk_mb ? " (" + mib(t.snapshots_disk_mb) + ")" : ""),
        used(t.volumes, q.max_volumes, String, t.volumes_disk_mb ? " (" + mib(t.volumes_disk_mb) + ")" : ""));
      return tr;
    });
    tenants.replaceChildren(...rows);
  }

  function renderHost(o) {
    const rows = [];
    const row = (k, v, attrs) => rows.push(el("dt", k), el("dd", v, attrs));
    row("Runtime for new sandboxes", o.runtime.name || "none usable", { id: "runtime" });
    if (o.runtime.why) row("Why", o.runtime.why, { id: "runtime-why" });
    if (o.host) {
      const h = o.host;
      row("Disk (state dir)", bytes(h.disk_free_bytes) + " free of " + bytes(h.disk_total_bytes) + "; " + bytes(h.disk_reserve_bytes) + " kept in reserve", { id: "host-disk" });
      row("Memory", bytes(h.memory_available_bytes) + " available of " + bytes(h.memory_total_bytes), { id: "host-mem" });
    } else {
      row("Host", "its free disk and memory are shown to admin keys only", { class: "muted" });
    }
    host.replaceChildren(...rows);
  }

  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const o = await api("GET", "/server");
      renderStates(o.sandboxes || {});
      renderActivity(o.activity);
      renderTenants(o.tenants || []);
      renderHost(o);
      document.getElementById("server").dataset.loaded = String(Date.now());
      setStatus(status, "updated " + new Date().toLocaleTimeString());
    } catch (e) {
      setStatus(status, e.message, true);
    } finally {
      busy = false;
    }
  }
  document.addEventListener("visibilitychange", refresh);
  refresh();
  setInterval(refresh, 10000);
})();
