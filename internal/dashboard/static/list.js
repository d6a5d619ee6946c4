// The sandboxes page: the list (refreshed every few seconds, filtered as
// you type), the create form, and pause, resume and kill per row.
"use strict";

(() => {
  const { api, el, duration, lifetimeLeft, metadataText, setStatus } = airlock;
  const table = document.getElementById("sandboxes");
  const tbody = table.querySelector("tbody");
  const admin = table.dataset.admin === "true";
  const filter = document.getElementById("filter");
  const listStatus = document.getElementById("list-status");
  const actionStatus = document.getElementById("action-status");
  const empty = document.getElementById("empty");
  const rows = new Map(); // sandbox id -> {tr, cells, sb}
  const groups = new Map(); // tenant -> group header row (admins)
  let last = [];

  function act(id, what) {
    const r = rows.get(id);
    setStatus(actionStatus, what + " " + id + "…");
    if (r) r.tr.querySelectorAll("button").forEach((b) => (b.disabled = true));
    const call = what === "kill" ? api("DELETE", "/sandboxes/" + id) : api("POST", "/sandboxes/" + id + "/" + what, {});
    call.then(() => setStatus(actionStatus, what + " " + id + ": done"))
      .catch((e) => setStatus(actionStatus, what + " " + id + ": " + e.message, true))
      .finally(refresh);
  }

  function confirmKill(r) {
    const td = r.cells.actions;
    td.replaceChildren();
    const q = el("span", "Kill " + r.sb.id + "? ");
    const yes = el("button", "Yes, kill", { type: "button", class: "danger primary", "data-action": "confirm-kill" });
    const no = el("button", "Cancel", { type: "button", "data-action": "cancel" });
    yes.addEventListener("click", () => { r.confirming = false; act(r.sb.id, "kill"); });
    no.addEventListener("click", () => { r.confirming = false; buttons(r); r.kill.focus(); });
    td.append(q, yes, no);
    r.confirming = true;
    no.focus();
  }

  function buttons(r) {
    const td = r.cells.actions;
    td.replaceChildren();
    r.pause = el("button", "Pause", { type: "button", "data-action": "pause", "aria-label": "Pause " + r.sb.id });
    r.resume = el("button", "Resume", { type: "button", "data-action": "resume", "aria-label": "Resume " + r.sb.id });
    r.kill = el("button", "Kill", { type: "button", class: "danger", "data-action": "kill", "aria-label": "Kill " + r.sb.id });
    r.pause.addEventListener("click", () => act(r.sb.id, "pause"));
    r.resume.addEventListener("click", () => act(r.sb.id, "resume"));
    r.kill.addEventListener("click", () => confirmKill(r));
    td.append(r.pause, r.resume, r.kill);
    enable(r);
  }

  function enable(r) {
    if (r.confirming) return;
    r.pause.disabled = r.sb.state !== "running";
    r.resume.disabled = r.sb.state !== "paused";
    r.kill.disabled = false;
  }

  function newRow(sb) {
    const tr = el("tr", null, { "data-id": sb.id });
    const cells = {};
    const idCell = el("td");
    idCell.append(el("a", sb.id, { href: "/ui/sandboxes/" + encodeURIComponent(sb.id), class: "mono" }));
    tr.append(idCell);
    const names = admin ? ["tenant"] : [];
    names.push("state", "image", "runtime", "size", "age", "left", "md", "actions");
    for (const n of names) {
      cells[n] = el("td", null, { class: n });
      tr.append(cells[n]);
    }
    const r = { tr, cells, sb, confirming: false };
    buttons(r);
    return r;
  }

  function update(r, sb, now) {
    r.sb = sb;
    const c = r.cells;
    if (c.tenant) c.tenant.textContent = sb.tenant;
    c.state.textContent = sb.state + (sb.reason ? " (" + sb.reason + ")" : "");
    c.state.className = "state state-" + sb.state;
    c.image.textContent = sb.image;
    c.runtime.textContent = sb.runtime;
    c.size.textContent = sb.cpus + " / " + sb.memory_mb + " MiB";
    c.age.textContent = duration((now - Date.parse(sb.created_at)) / 1000);
    c.left.textContent = duration(lifetimeLeft(sb, now)) + (sb.state === "paused" ? " (paused)" : "");
    c.md.textContent = metadataText(sb.metadata);
    enable(r);
  }

  function matches(sb, q) {
    if (!q) return true;
    const hay = [sb.id, sb.tenant, sb.state, sb.image, sb.runtime, metadataText(sb.metadata)].join(" ").toLowerCase();
    return q.toLowerCase().split(/\s+/).every((w) => hay.includes(w));
  }

  function render() {
    const now = Date.now();
    const q = filter.value.trim();
    const seen = new Set();
    const shown = last.filter((sb) => matches(sb, q));
    shown.sort((a, b) => (admin ? a.tenant.localeCompare(b.tenant) : 0) || b.created_at.localeCompare(a.created_at));
    const order = [];
    let tenant = null;
    for (const sb of shown) {
      if (admin && sb.tenant !== tenant) {
        tenant = sb.tenant;
        let g = groups.get(tenant);
        if (!g) {
          g = el("tr", null, { class: "group" });
          const th = el("th", "tenant " + tenant, { colspan: String(table.tHead.rows[0].cells.length), scope: "colgroup" });
          g.append(th);
          groups.set(tenant, g);
        }
        order.push(g);
      }
      let r = rows.get(sb.id);
      if (!r) {
        r = newRow(sb);
        rows.set(sb.id, r);
      }
      update(r, sb, now);
      seen.add(sb.id);
      order.push(r.tr);
    }
    for (const [id, r] of rows) {
      if (!last.some((sb) => sb.id === id)) rows.delete(id);
      else if (!seen.has(id)) r.tr.remove();
    }
    // Re-append in order: rows that stay keep their elements (and focus).
    const children = Array.from(tbody.children);
    if (children.length !== order.length || children.some((c, i) => c !== order[i])) {
      const active = document.activeElement;
      for (const c of children) if (!order.includes(c)) c.remove();
      order.forEach((tr) => tbody.append(tr));
      if (active && document.contains(active)) active.focus();
    }
    empty.hidden = shown.length !== 0;
  }

  async function refresh() {
    try {
      const data = await api("GET", "/sandboxes");
      last = Array.isArray(data) ? data : (data && data.sandboxes) || [];
      render();
      setStatus(listStatus, "updated " + new Date().toLocaleTimeString());
    } catch (e) {
      setStatus(listStatus, "refresh: " + e.message, true);
    }
  }

  filter.addEventListener("input", render);

  const form = document.getElementById("create-form");
  const createStatus = document.getElementById("create-status");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const allow = String(f.get("allow") || "").split("\n").map((s) => s.trim()).filter(Boolean);
    const body = {
      image: String(f.get("image")).trim(),
      cpus: parseInt(f.get("cpus"), 10),
      memory_mb: parseInt(f.get("memory_mb"), 10),
      network: { mode: String(f.get("mode")), allow },
    };
    const button = document.getElementById("create");
    button.disabled = true;
    setStatus(createStatus, "creating…");
    try {
      const sb = await api("POST", "/sandboxes", body);
      setStatus(createStatus, "created " + sb.id);
    } catch (e) {
      setStatus(createStatus, "create: " + e.message, true);
    } finally {
      button.disabled = false;
      refresh();
    }
  });

  refresh();
  setInterval(refresh, 3000);
})();
