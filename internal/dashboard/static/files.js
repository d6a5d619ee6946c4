// A sandbox's file browser: list a directory (GET .../files/list), go into
// directories and up, download a file (a link to GET .../files, which the
// server answers as an attachment: the browser saves it, never shows it on
// this origin), upload one into the current directory (PUT .../files),
// rename or move an entry (POST .../files/rename) and delete one (DELETE
// .../files, asked first, in the row: no dialogs).
// Names come from the guest and are hostile: they go into the page as
// text, and paths are built here from checked parts and URL-encoded.
"use strict";

(() => {
  const { api, el, setStatus } = airlock;
  const id = document.getElementById("sandbox").dataset.id;
  const base = "/v1/sandboxes/" + encodeURIComponent(id);
  const dirInput = document.getElementById("dir");
  const tbody = document.querySelector("#files tbody");
  const empty = document.getElementById("files-empty");
  const status = document.getElementById("files-status");
  const upStatus = document.getElementById("upload-status");
  const upBtn = document.getElementById("dir-up");
  let dir = "/root";

  // clean makes p an absolute, clean path (no ., .. or empty parts), as
  // the API wants it.
  function clean(p) {
    const out = [];
    for (const part of String(p).split("/")) {
      if (part === "" || part === ".") continue;
      if (part === "..") out.pop();
      else out.push(part);
    }
    return "/" + out.join("/");
  }

  // join is dir/name, or null when name is not one plain name.
  function join(d, name) {
    if (typeof name !== "string" || name === "" || name === "." || name === ".." || name.includes("/") || name.includes("\0")) return null;
    return d === "/" ? "/" + name : d + "/" + name;
  }

  function parent(d) {
    return clean(d + "/..");
  }

  function size(n) {
    if (typeof n !== "number") return "";
    if (n < 1024) return n + " B";
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let v = n / 1024, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return v.toFixed(v < 10 ? 1 : 0) + " " + units[i];
  }

  function mode(m) {
    return typeof m === "number" ? (m & 0o7777).toString(8).padStart(4, "0") : "";
  }

  function entryRow(e) {
    const p = join(dir, e.name);
    if (p === null) return null;
    const tr = el("tr", null, { "data-name": e.name, "data-type": e.type });
    const nameCell = el("td", null, { class: "name" });
    if (e.type === "dir") {
      const b = el("button", e.name + "/", { type: "button", class: "link mono", "data-action": "open" });
      b.addEventListener("click", () => list(p, true));
      nameCell.append(b);
    } else if (e.type === "file" || e.type === "symlink") {
      // The server's answer to this link is an attachment; download names
      // the saved file too.
      nameCell.append(el("a", e.name, {
        href: base + "/files?path=" + encodeURIComponent(p), download: e.name, class: "mono",
        "data-action": "download", "aria-label": "Download " + e.name,
      }));
    } else {
      nameCell.append(el("span", e.name, { class: "mono" }));
    }
    if (e.type === "symlink" && e.symlink_target) nameCell.append(el("span", " → " + e.symlink_target, { class: "muted mono" }));
    const actions = el("td", null, { class: "actions" });
    tr.append(nameCell, el("td", e.type), el("td", e.type === "dir" ? "" : size(e.size), { class: "num" }),
      el("td", e.mtime ? new Date(e.mtime).toLocaleString() : ""), el("td", mode(e.mode), { class: "mono" }), actions);
    idleActions(actions, e, p);
    return tr;
  }

  // idleActions puts an entry's Rename and Delete buttons in its cell.
  function idleActions(cell, e, p) {
    const ren = el("button", "Rename", { type: "button", "data-action": "rename", "aria-label": "Rename or move " + e.name });
    const del = el("button", "Delete", { type: "button", class: "danger", "data-action": "delete", "aria-label": "Delete " + e.name });
    ren.addEventListener("click", () => renaming(cell, e, p));
    del.addEventListener("click", () => deleting(cell, e, p));
    cell.replaceChildren(ren, del);
    return { ren, del };
  }

  // renaming asks for the new name (or an absolute path: a move) in the
  // row; Enter or Save renames, Escape or Cancel puts the buttons back.
  function renaming(cell, e, p) {
    const form = el("form", null, { class: "inline rename" });
    const input = el("input", null, { class: "mono", "data-action": "new-name", "aria-label": "New name or absolute path for " + e.name,
      spellcheck: "false", autocomplete: "off", maxlength: "4096", required: "" });
    input.value = e.name;
    const save = el("button", "Save", { type: "submit", "data-action": "save-rename" });
    const cancel = el("button", "Cancel", { type: "button", "data-action": "cancel" });
    const back = () => idleActions(cell, e, p).ren.focus();
    cancel.addEventListener("click", back);
    input.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { ev.preventDefault(); back(); } });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const v = input.value.trim();
      const to = v.startsWith("/") ? clean(v) : join(dir, v);
      if (to === null || to === "/") {
        setStatus(status, "a new name is one name, or an absolute path", true);
        input.focus();
        return;
      }
      if (to === p) { back(); return; }
      save.disabled = true;
      setStatus(status, "renaming " + e.name + "…");
      try {
        await api("POST", "/sandboxes/" + encodeURIComponent(id) + "/files/rename", { from: p, to });
        setStatus(status, "renamed " + p + " to " + to);
        await list(dir, false, true);
      } catch (err) {
        setStatus(status, "rename " + e.name + ": " + err.message, true);
        save.disabled = false;
        input.focus();
      }
    });
    form.append(input, save, cancel);
    cell.replaceChildren(form);
    input.focus();
    input.select();
  }

  // deleting asks in the row first; a directory goes with its contents.
  function deleting(cell, e, p) {
    const what = e.type === "dir" ? "Delete " + e.name + "/ and everything in it?" : "Delete " + e.name + "?";
    const ask = el("span", what, { class: "confirm" });
    const yes = el("button", "Delete", { type: "button", class: "danger primary", "data-action": "confirm-delete" });
    const no = el("button", "Cancel", { type: "button", "data-action": "cancel" });
    no.addEventListener("click", () => idleActions(cell, e, p).del.focus());
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      setStatus(status, "deleting " + e.name + "…");
      try {
        await api("DELETE", "/sandboxes/" + encodeURIComponent(id) + "/files?path=" + encodeURIComponent(p) + (e.type === "dir" ? "&recursive=true" : ""));
        setStatus(status, "deleted " + p);
        await list(dir, false, true);
      } catch (err) {
        setStatus(status, "delete " + e.name + ": " + err.message, true);
        yes.disabled = false;
      }
    });
    cell.replaceChildren(ask, yes, no);
    no.focus();
  }

  // list shows directory d; focus moves to the first entry when the user
  // went somewhere (keyboard users keep their place); quiet keeps the
  // status line (it says what was just done).
  async function list(d, focus, quiet) {
    d = clean(d);
    if (!quiet) setStatus(status, "listing " + d + "…");
    try {
      const data = await api("GET", "/sandboxes/" + encodeURIComponent(id) + "/files/list?path=" + encodeURIComponent(d));
      dir = d;
      dirInput.value = d;
      upBtn.disabled = d === "/";
      const entries = ((data && data.entries) || []).filter((e) => e && e.path !== d);
      entries.sort((a, b) => (a.type === "dir") !== (b.type === "dir") ? (a.type === "dir" ? -1 : 1) : (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      const rows = [];
      for (const e of entries) {
        const r = entryRow(e);
        if (r) rows.push(r);
      }
      tbody.replaceChildren(...rows);
      empty.hidden = rows.length !== 0;
      if (!quiet) setStatus(status, rows.length + (rows.length === 1 ? " entry" : " entries") + (data && data.truncated ? " (truncated)" : ""));
      if (quiet) {
        const a = document.activeElement;
        if (!a || a === document.body) dirInput.focus(); // the row that had it is gone
      }
      if (focus) {
        const first = tbody.querySelector("button, a");
        (first || dirInput).focus();
      }
    } catch (e) {
      setStatus(status, d + ": " + e.message, true);
    }
  }

  document.getElementById("dir-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    list(dirInput.value, false);
  });
  upBtn.addEventListener("click", () => list(parent(dir), true));
  document.getElementById("dir-refresh").addEventListener("click", () => list(dir, false));

  // Upload: the file's bytes as the body of PUT .../files, streamed by the
  // browser, with the CSRF header (api() sends JSON, so fetch here).
  const form = document.getElementById("upload-form");
  const input = document.getElementById("upload-file");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = input.files && input.files[0];
    if (!f) {
      setStatus(upStatus, "choose a file first", true);
      return;
    }
    const p = join(dir, f.name);
    if (p === null) {
      setStatus(upStatus, "that file name cannot be used", true);
      return;
    }
    const btn = document.getElementById("upload");
    btn.disabled = true;
    setStatus(upStatus, "uploading " + f.name + "…");
    try {
      const res = await fetch(base + "/files?path=" + encodeURIComponent(p), {
        method: "PUT", body: f, credentials: "same-origin", cache: "no-store",
        headers: { "Content-Type": "application/octet-stream", "X-Airlock-CSRF": airlock.csrf, Accept: "application/json" },
      });
      if (res.status === 401) {
        window.location.assign("/ui/sign-in");
        return;
      }
      const data = await res.json().catch(() => null);
      if (!res.ok) throw new Error(data && data.error ? data.error.message + " (" + data.error.code + ")" : "HTTP " + res.status);
      setStatus(upStatus, "uploaded " + p + " (" + size(data && data.size) + ")");
      form.reset();
      list(dir, false);
    } catch (e) {
      setStatus(upStatus, "upload: " + e.message, true);
    } finally {
      btn.disabled = false;
    }
  });

  // The first listing waits for the user unless the sandbox runs: a file
  // call resumes a paused sandbox, which opening its page must not do.
  api("GET", "/sandboxes/" + encodeURIComponent(id)).then((sb) => {
    if (sb && sb.state === "running") list(dir, false);
    else setStatus(status, "the sandbox is " + (sb && sb.state) + ": Open or Refresh lists its files (and resumes it)");
  }).catch((e) => setStatus(status, e.message, true));
})();
