// A browser sandbox's live view: noVNC on the sandbox's preview host (its
// own origin: the page comes from the sandbox and never runs on this
// one), opened in its own tab (a frame would need the preview host's
// cookie in a third-party context, which browsers refuse over http).
// Shown for sandboxes of the image "browser".
"use strict";

(() => {
  const { api, setStatus } = airlock;
  const id = document.getElementById("sandbox").dataset.id;
  const card = document.getElementById("browser-card");
  const show = document.getElementById("browser-view");
  const interactive = document.getElementById("browser-interactive");
  const status = document.getElementById("browser-status");
  const link = document.getElementById("browser-link");

  async function init() {
    try {
      const sb = await api("GET", "/sandboxes/" + encodeURIComponent(id));
      card.hidden = sb.image !== "browser";
    } catch (e) {
      // The details card reports errors.
    }
  }

  async function view() {
    show.disabled = true;
    setStatus(status, "starting the browser (seconds on gVisor, minutes under QEMU without KVM)…");
    try {
      const b = await api("POST", "/sandboxes/" + encodeURIComponent(id) + "/browser", { view: true, interactive: interactive.checked });
      if (!b.view_url) {
        link.hidden = true;
        setStatus(status, "this server has no preview domain (airlock serve --preview-domain): the live view's page comes from the sandbox, so it is shown only on the sandbox's own preview host", true);
        return;
      }
      link.href = b.view_url;
      link.hidden = false;
      setStatus(status, b.browser + (interactive.checked ? ", with keyboard and mouse" : ", view only"));
    } catch (e) {
      setStatus(status, e.message, true);
    } finally {
      show.disabled = false;
    }
  }

  show.addEventListener("click", view);
  init();
})();
