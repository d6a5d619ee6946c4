// A sandbox's audit events, live: GET /v1/events?sandbox=ID&since=N every
// few seconds, new ones added at the top (newest first), the list capped.
"use strict";

(() => {
  const { api, el, setStatus } = airlock;
  const id = document.getElementById("sandbox").dataset.id;
  const list = document.getElementById("events");
  const empty = document.getElementById("events-empty");
  const status = document.getElementById("events-status");
  const keep = 200; // events shown
  const page = 500; // events asked for per call
  let since = 0;
  let busy = false;

  // detail is a short line of an event's detail object.
  function detail(d) {
    if (!d || typeof d !== "object") return "";
    const parts = [];
    for (const [k, v] of Object.entries(d)) {
      let s = typeof v === "string" ? v : JSON.stringify(v);
      if (s === undefined) continue;
      if (s.length > 80) s = s.slice(0, 79) + "…";
      parts.push(k + "=" + s);
    }
    const line = parts.join(", ");
    return line.length > 240 ? line.slice(0, 239) + "…" : line;
  }

  function item(ev) {
    const li = el("li", null, { "data-action": String(ev.action), "data-seq": String(ev.seq) });
    const t = new Date(ev.time);
    li.append(el("time", t.toLocaleTimeString(), { datetime: t.toISOString(), title: t.toLocaleString() }), " ",
      el("code", ev.action, { class: "action" }), " ", el("span", detail(ev.detail), { class: "detail" }));
    return li;
  }

  async function poll() {
    if (busy) return;
    busy = true;
    try {
      // Catch up a page at a time (the first poll of a busy sandbox), a
      // bounded number of pages per tick.
      for (let i = 0; i < 10; i++) {
        const data = await api("GET", "/events?sandbox=" + encodeURIComponent(id) + "&since=" + since + "&limit=" + page);
        const evs = (data && data.events) || [];
        for (const ev of evs) list.prepend(item(ev));
        if (typeof data.next === "number" && data.next > since) since = data.next;
        while (list.children.length > keep) list.lastElementChild.remove();
        if (evs.length < page) break;
      }
      empty.hidden = list.children.length !== 0;
      setStatus(status, "updated " + new Date().toLocaleTimeString());
    } catch (e) {
      setStatus(status, "events: " + e.message, true);
    } finally {
      busy = false;
    }
  }

  poll();
  setInterval(poll, 3000);
})();
