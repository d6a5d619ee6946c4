// A sandbox's lifecycle from its page: pause, resume, set its lifetime
// (POST .../timeout), snapshot it under a name, fork it, kill it (asked
// first, in the page: no dialogs). The buttons follow the state that
// sandbox.js last read (data-state on #sandbox).
"use strict";

(() => {
  const { api, el, setStatus } = airlock;
  const box = document.getElementById("sandbox");
  const id = box.dataset.id;
  const base = "/sandboxes/" + encodeURIComponent(id);
  const status = document.getElementById("act-status");
  const pause = document.getElementById("sb-pause");
  const resume = document.getElementById("sb-resume");
  const fork = document.getElementById("sb-fork");
  const kill = document.getElementById("sb-kill");
  const killAsk = document.getElementById("kill-ask");
  const killYes = document.getElementById("sb-kill-yes");
  const killNo = document.getElementById("sb-kill-no");
  const snapForm = document.getElementById("snapshot-form");
  const snapName = document.getElementById("snap-name");
  const extendForm = document.getElementById("extend-form");
  let busy = false;

  function sync() {
    const st = box.dataset.state || "";
    pause.disabled = busy || st !== "running";
    resume.disabled = busy || st !== "paused";
    fork.disabled = busy || !(st === "running" || st === "paused");
    document.getElementById("snapshot").disabled = busy || !(st === "running" || st === "paused");
    document.getElementById("extend-go").disabled = busy || !(st === "running" || st === "paused");
  }

  // run does one action, saying what it does and how it went.
  async function run(what, call, done) {
    if (busy) return;
    busy = true;
    sync();
    setStatus(status, what + "…");
    try {
      const out = await call();
      if (done) done(out);
      else setStatus(status, what + ": done");
    } catch (e) {
      setStatus(status, what + ": " + e.message, true);
    } finally {
      busy = false;
      sync();
    }
  }

  pause.addEventListener("click", () => run("pausing", () => api("POST", base + "/pause", {})));
  resume.addEventListener("click", () => run("resuming", () => api("POST", base + "/resume", {})));
  extendForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const s = parseInt(document.getElementById("extend").value, 10);
    run("setting the lifetime", () => api("POST", base + "/timeout", { timeout_s: s }),
      () => setStatus(status, "lifetime set: " + airlock.duration(s) + " from now"));
  });
  snapForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const name = snapName.value.trim();
    run("saving snapshot " + name, () => api("POST", base + "/snapshot", { name }), (sn) => {
      setStatus(status, "saved snapshot " + ((sn && sn.name) || name));
      snapForm.reset();
    });
  });
  fork.addEventListener("click", () => run("forking", () => api("POST", base + "/fork", { count: 1 }), (out) => {
    const sbs = Array.isArray(out) ? out : (out && out.sandboxes) || [];
    status.classList.remove("bad");
    status.replaceChildren(document.createTextNode("forked: "));
    sbs.forEach((sb, i) => {
      if (i) status.append(", ");
      status.append(el("a", sb.id, { href: "/ui/sandboxes/" + encodeURIComponent(sb.id), class: "mono", "data-fork": sb.id }));
    });
  }));

  function asking(on) {
    kill.hidden = on;
    killAsk.hidden = !on;
    (on ? killNo : kill).focus();
  }
  kill.addEventListener("click", () => asking(true));
  killNo.addEventListener("click", () => asking(false));
  killAsk.addEventListener("keydown", (ev) => { if (ev.key === "Escape") asking(false); });
  killYes.addEventListener("click", () => run("killing", () => api("DELETE", base), () => window.location.assign("/")));

  // sandbox.js updates data-state every few seconds.
  new MutationObserver(sync).observe(box, { attributes: true, attributeFilter: ["data-state", "data-runtime"] });
  sync();
})();
