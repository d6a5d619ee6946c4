// A sandbox's code cell: runs the textarea's code in the sandbox's default
// Python context (POST .../code) and shows the NDJSON stream as it comes:
// stdout and stderr as text, results (PNG and JPEG images inline, as
// data: URLs; anything else as its text/plain form), the error of an
// exception, airlock's status lines while the context starts, and the end.
// Everything the guest sends goes into the page as text.
"use strict";

(() => {
  const { el, setStatus } = airlock;
  const id = document.getElementById("sandbox").dataset.id;
  const form = document.getElementById("code-form");
  const code = document.getElementById("code");
  const runBtn = document.getElementById("run-code");
  const status = document.getElementById("code-status");
  const out = document.getElementById("code-out");
  // The page keeps at most this much text of one run's output.
  const maxText = 1 << 20;
  const b64 = /^[A-Za-z0-9+/]*={0,2}$/;
  // ANSI colour codes in IPython's tracebacks.
  const ansi = /\x1b\[[0-9;]*[A-Za-z]/g;

  let last = null; // the <pre> of the last stdout/stderr chunk
  let textLen = 0;

  function text(kind, s) {
    if (textLen >= maxText) return;
    s = String(s);
    if (textLen + s.length > maxText) s = s.slice(0, maxText - textLen) + "\n[output cut: the page keeps 1 MiB]";
    textLen += s.length;
    if (last && last.dataset.kind === kind) {
      last.textContent += s;
    } else {
      last = el("pre", s, { class: "out " + kind, "data-kind": kind });
      out.append(last);
    }
  }

  function block(node) {
    last = null;
    out.append(node);
  }

  function result(ev) {
    const data = ev.data && typeof ev.data === "object" ? ev.data : {};
    for (const t of ["image/png", "image/jpeg"]) {
      const v = data[t];
      if (typeof v === "string" && v.length > 0 && b64.test(v)) {
        block(el("img", null, { src: "data:" + t + ";base64," + v, alt: "a " + t + " result" + (ev.file ? " (" + ev.file + ")" : ""), class: "result", "data-type": t }));
        return;
      }
    }
    const plain = data["text/plain"];
    if (typeof plain === "string") {
      block(el("pre", plain, { class: "out result", "data-kind": "result" }));
      return;
    }
    const types = Object.keys(data);
    if (types.length) block(el("p", "a result of type " + types.join(", ") + " (not shown here)", { class: "muted" }));
  }

  function handle(ev, done) {
    switch (ev.type) {
      case "stdout":
      case "stderr":
        text(ev.type, typeof ev.data === "string" ? ev.data : "");
        break;
      case "result":
        result(ev);
        break;
      case "status":
        setStatus(status, String(ev.data || ""));
        break;
      case "error": {
        const tb = Array.isArray(ev.traceback) ? ev.traceback.join("\n").replace(ansi, "") : "";
        block(el("pre", (ev.name || "Error") + ": " + (ev.value || "") + (tb ? "\n" + tb : ""), { class: "out error", "data-kind": "error" }));
        break;
      }
      case "end":
        done.end = true;
        setStatus(status, (ev.timed_out ? "timed out" : "done") + " in " + ev.duration_ms + " ms" +
          (ev.execution_count ? " [" + ev.execution_count + "]" : "") + (ev.truncated ? " (output truncated)" : ""), !!ev.timed_out);
        break;
    }
  }

  async function run() {
    runBtn.disabled = true;
    out.replaceChildren();
    out.hidden = false;
    last = null;
    textLen = 0;
    setStatus(status, "running…");
    const done = { end: false };
    try {
      const res = await fetch("/v1/sandboxes/" + encodeURIComponent(id) + "/code", {
        method: "POST", credentials: "same-origin", cache: "no-store",
        headers: { "Content-Type": "application/json", Accept: "application/x-ndjson", "X-Airlock-CSRF": airlock.csrf },
        body: JSON.stringify({ code: code.value }),
      });
      if (res.status === 401) {
        window.location.assign("/ui/sign-in");
        return;
      }
      if (!res.ok) {
        const data = await res.json().catch(() => null);
        throw new Error(data && data.error ? data.error.message + " (" + data.error.code + ")" : "HTTP " + res.status);
      }
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done: eof } = await reader.read();
        if (value) buf += value;
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.trim()) continue;
          let ev;
          try { ev = JSON.parse(line); } catch (e) { continue; }
          handle(ev, done);
        }
        if (eof) break;
      }
      if (!done.end) setStatus(status, "the run's stream broke before its end", true);
    } catch (e) {
      setStatus(status, "run: " + e.message, true);
    } finally {
      runBtn.disabled = false;
    }
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!runBtn.disabled) run();
  });
  code.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      if (!runBtn.disabled) run();
    }
  });
})();
