// A sandbox's logs: the end of its guest's serial console and, for an
// admin, its supervisor's log (GET .../logs, which never resumes the
// sandbox), and the commands run in it with their output (GET .../execs,
// then a finished one's retained output from GET .../execs/ID/stream).
// All of it is the guest's output: it goes into the page as text only.
"use strict";

(() => {
  const { api, el, setStatus } = airlock;
  const id = document.getElementById("sandbox").dataset.id;
  const base = "/sandboxes/" + encodeURIComponent(id);
  const box = document.getElementById("logs");
  const status = document.getElementById("logs-status");
  const execBody = document.querySelector("#execs tbody");
  const execStatus = document.getElementById("execs-status");
  const maxOutput = 256 << 10; // characters of one command's output shown

  const titles = { console: "Guest console", supervisor: "Supervisor log (the host's account; admins only)" };

  function bytes(n) {
    if (n < 1024) return n + " B";
    if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
    return (n / (1 << 20)).toFixed(1) + " MiB";
  }

  function logBlock(l) {
    const div = el("div", null, { class: "log", "data-source": String(l.source) });
    const h = el("h3", titles[l.source] || String(l.source));
    div.append(h);
    if (!l.exists) {
      div.append(el("p", "None yet.", { class: "muted" }));
      return div;
    }
    if (!l.size) {
      div.append(el("p", "Empty so far (a sandbox started from a saved template or snapshot has no boot messages).", { class: "muted" }));
      return div;
    }
    div.append(el("p", bytes(l.size) + (l.truncated ? ", the last " + bytes(l.text.length) + " shown" : ""), { class: "muted" }));
    const pre = el("pre", l.text, { class: "out log-text", tabindex: "0", "aria-label": titles[l.source] || String(l.source) });
    div.append(pre);
    return div;
  }

  async function loadLogs() {
    setStatus(status, "loading…");
    try {
      const data = await api("GET", base + "/logs");
      const blocks = ((data && data.logs) || []).map(logBlock);
      box.replaceChildren(...blocks);
      for (const pre of box.querySelectorAll("pre")) pre.scrollTop = pre.scrollHeight;
      setStatus(status, "loaded " + new Date().toLocaleTimeString());
    } catch (e) {
      setStatus(status, e.message, true);
    }
  }

  // output reads an exec's retained output (NDJSON lines) as text.
  async function output(execId) {
    const res = await fetch("/v1" + base + "/execs/" + encodeURIComponent(execId) + "/stream", {
      credentials: "same-origin", cache: "no-store", headers: { Accept: "application/x-ndjson" },
    });
    if (res.status === 401) {
      window.location.assign("/ui/sign-in");
      throw new Error("signed out");
    }
    const text = await res.text();
    if (!res.ok) {
      let msg = "HTTP " + res.status;
      try { const d = JSON.parse(text); if (d && d.error) msg = d.error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    let out = "", cut = false;
    for (const line of text.split("\n")) {
      if (!line) continue;
      let ev;
      try { ev = JSON.parse(line); } catch (e) { continue; }
      if ((ev.type === "stdout" || ev.type === "stderr") && typeof ev.data === "string") {
        if (out.length + ev.data.length > maxOutput) { cut = true; continue; }
        out += ev.data;
      }
    }
    return { out, cut };
  }

  function exitText(x) {
    if (!x) return "";
    if (x.signal) return "signal " + x.signal + (x.oom_killed ? " (out of memory)" : "");
    return "exit " + x.code + (x.timeout ? " (timed out)" : "");
  }

  function took(ms) {
    return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(1) + " s";
  }

  function execRow(x) {
    const tr = el("tr", null, { "data-exec": String(x.exec_id) });
    const cmd = Array.isArray(x.cmd) ? x.cmd.join(" ") : "";
    const started = x.started_at ? new Date(x.started_at) : null;
    const act = el("td", null, { class: "actions" });
    if (x.state === "exited") {
      const b = el("button", "Output", { type: "button", "data-action": "output", "aria-expanded": "false", "aria-label": "Output of " + cmd });
      let shown = null;
      b.addEventListener("click", async () => {
        if (shown) {
          shown.remove();
          shown = null;
          b.textContent = "Output";
          b.setAttribute("aria-expanded", "false");
          return;
        }
        b.disabled = true;
        try {
          const { out, cut } = await output(x.exec_id);
          shown = el("tr", null, { class: "exec-output" });
          const td = el("td", null, { colspan: "5" });
          td.append(el("pre", out === "" ? "(no output)" : out, { class: "out", tabindex: "0" }));
          if (cut) td.append(el("p", "Only the first " + bytes(maxOutput) + " shown.", { class: "muted" }));
          shown.append(td);
          tr.after(shown);
          b.textContent = "Hide output";
          b.setAttribute("aria-expanded", "true");
        } catch (e) {
          setStatus(execStatus, "output: " + e.message, true);
        } finally {
          b.disabled = false;
        }
      });
      act.append(b);
    }
    tr.append(el("td", cmd, { class: "mono cmd" }), el("td", x.state === "exited" ? exitText(x.exit) : String(x.state)),
      el("td", started ? started.toLocaleTimeString() : "", started ? { title: started.toLocaleString() } : {}),
      el("td", x.exit && typeof x.exit.duration_ms === "number" ? took(x.exit.duration_ms) : "", { class: "num" }), act);
    return tr;
  }

  async function loadExecs() {
    // Listing commands asks the guest: it would resume a paused sandbox,
    // which opening or refreshing this card must not do.
    let sb;
    try {
      sb = await api("GET", base);
    } catch (e) {
      setStatus(execStatus, e.message, true);
      return;
    }
    if (!sb || sb.state !== "running") {
      execBody.replaceChildren();
      setStatus(execStatus, "the sandbox is " + (sb && sb.state) + ": its commands show while it runs");
      return;
    }
    try {
      const data = await api("GET", base + "/execs");
      const execs = ((data && data.execs) || []).slice();
      execs.sort((a, b) => Date.parse(b.started_at || 0) - Date.parse(a.started_at || 0));
      execBody.replaceChildren(...execs.map(execRow));
      setStatus(execStatus, execs.length + (execs.length === 1 ? " command" : " commands") + " (newest first; the supervisor keeps recent ones)");
    } catch (e) {
      setStatus(execStatus, e.message, true);
    }
  }

  document.getElementById("logs-refresh").addEventListener("click", () => { loadLogs(); loadExecs(); });
  loadLogs();
  loadExecs();
})();
