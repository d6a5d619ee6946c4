// A sandbox's page: its details (refreshed every few seconds) and a live
// terminal over the /v1 PTY WebSocket (xterm.js). Binary messages are the
// terminal's bytes both ways; text messages are JSON control.
"use strict";

(() => {
  const { api, el, duration, lifetimeLeft, metadataText, setStatus } = airlock;
  const id = document.getElementById("sandbox").dataset.id;
  const details = document.getElementById("details");
  const sbStatus = document.getElementById("sb-status");
  const termStatus = document.getElementById("term-status");
  const openBtn = document.getElementById("open-terminal");
  const closeBtn = document.getElementById("close-terminal");
  const box = document.getElementById("terminal");
  box.hidden = true;

  function row(k, v) {
    details.append(el("dt", k), el("dd", v === undefined || v === null ? "" : v));
  }

  function networkText(n) {
    if (!n) return "";
    let s = n.mode || "public";
    if (n.allow && n.allow.length) s += "; allow " + n.allow.join(", ");
    if (n.ports && n.ports.length) s += "; ports " + n.ports.map((p) => (p.host_port || "") + ":" + (p.guest_port || "")).join(", ");
    return s;
  }

  async function refresh() {
    try {
      const sb = await api("GET", "/sandboxes/" + encodeURIComponent(id));
      // usage.js samples only while this says running, and charts CPU
      // as a share of the sandbox's vCPUs.
      const box = document.getElementById("sandbox");
      box.dataset.state = sb.state;
      box.dataset.cpus = String(sb.cpus);
      box.dataset.runtime = sb.runtime;
      const now = Date.now();
      details.replaceChildren();
      row("State", sb.state + (sb.reason ? " (" + sb.reason + ")" : ""));
      row("Tenant", sb.tenant);
      row("Image", sb.image + (sb.image_digest ? " (" + sb.image_digest + ")" : ""));
      row("Runtime", sb.runtime + (sb.accel ? ", " + sb.accel : ""));
      row("CPUs / memory / disk", sb.cpus + " / " + sb.memory_mb + " MiB / " + sb.disk_mb + " MiB");
      row("Created", new Date(sb.created_at).toLocaleString() + " (" + duration((now - Date.parse(sb.created_at)) / 1000) + " ago)");
      row("Lifetime left", duration(lifetimeLeft(sb, now)) + (sb.state === "paused" ? " (paused: the lifetime counts running time)" : ""));
      row("Network", networkText(sb.network));
      row("Metadata", metadataText(sb.metadata));
      if (sb.source) row("Source", sb.source);
      setStatus(sbStatus, "updated " + new Date().toLocaleTimeString());
    } catch (e) {
      setStatus(sbStatus, e.message, true);
    }
  }

  let term = null;
  let ws = null;

  function openTerminal() {
    if (ws) return;
    box.hidden = false;
    if (!term) {
      term = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false, scrollback: 5000 });
      term.open(box);
      term.onData((d) => {
        if (ws && ws.readyState === WebSocket.OPEN) ws.send(new TextEncoder().encode(d));
      });
      term.onResize(({ rows, cols }) => {
        if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows, cols }));
      });
    }
    const size = fit();
    const proto = window.location.protocol === "https:" ? "wss:" : "ws:";
    const url = proto + "//" + window.location.host + "/v1/sandboxes/" + encodeURIComponent(id) + "/pty?rows=" + size.rows + "&cols=" + size.cols;
    ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    setStatus(termStatus, "connecting…");
    openBtn.hidden = true;
    closeBtn.hidden = false;
    ws.onmessage = (ev) => {
      if (typeof ev.data !== "string") {
        term.write(new Uint8Array(ev.data));
        return;
      }
      let m;
      try { m = JSON.parse(ev.data); } catch (e) { return; }
      if (m.type === "started") setStatus(termStatus, "connected (exec " + m.exec_id + ")");
      else if (m.type === "exit") setStatus(termStatus, "exited" + (m.exit && m.exit.code !== undefined ? " with code " + m.exit.code : ""));
      else if (m.type === "error") setStatus(termStatus, m.error, true);
    };
    ws.onclose = () => {
      ws = null;
      openBtn.hidden = false;
      closeBtn.hidden = true;
      if (!termStatus.classList.contains("bad") && !termStatus.textContent.startsWith("exited")) setStatus(termStatus, "closed");
    };
    ws.onerror = () => setStatus(termStatus, "the terminal's connection failed", true);
    term.focus();
  }

  // fit sizes the terminal to its box (xterm's fit addon is not vendored:
  // the cell size comes from the rendered rows).
  function fit() {
    const rowsEl = box.querySelector(".xterm-rows");
    const cell = rowsEl && rowsEl.firstElementChild ? rowsEl.firstElementChild.getBoundingClientRect() : null;
    let rows = 24, cols = 80;
    if (cell && cell.height > 0) {
      rows = Math.max(5, Math.floor((box.clientHeight - 8) / cell.height));
      const ch = term._core && term._core._renderService ? term._core._renderService.dimensions.css.cell.width : 0;
      if (ch > 0) cols = Math.max(20, Math.floor((box.clientWidth - 24) / ch));
    }
    if (rows !== term.rows || cols !== term.cols) term.resize(cols, rows);
    return { rows, cols };
  }

  openBtn.addEventListener("click", openTerminal);
  closeBtn.addEventListener("click", () => { if (ws) ws.close(1000, "closed by the user"); openBtn.focus(); });
  window.addEventListener("resize", () => { if (term) fit(); });

  refresh();
  setInterval(refresh, 3000);
})();
