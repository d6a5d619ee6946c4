// A sandbox's resource use over time: GET /v1/sandboxes/ID/usage every few
// seconds while the sandbox runs (sandbox.js keeps its state and vCPUs in
// the #sandbox element's data-state and data-cpus) and the page is
// visible, the last samples kept in memory, drawn as SVG line charts made
// with DOM calls, each with a text summary for screen readers. The route never resumes a paused
// sandbox and is not activity, so an open page keeps nothing awake.
"use strict";

(() => {
  const { api, setStatus } = airlock;
  const box = document.getElementById("sandbox");
  const id = box.dataset.id;
  const status = document.getElementById("usage-status");
  const toggle = document.getElementById("usage-toggle");
  const every = 3000; // ms between samples
  const keep = 61; // samples kept: 60 intervals
  const W = 300, H = 80; // the charts' viewBox
  const svgNS = "http://www.w3.org/2000/svg";

  // samples are the answers of the usage route, oldest first, each with
  // t (ms) and seg: a sample starts a new segment after the sandbox was not
  // running or a poll failed, and no rate is taken across segments (a
  // resume restarts the network counters).
  const samples = [];
  let seg = 0;
  let broken = false; // the next sample starts a new segment
  let busy = false;
  let paused = false;

  const charts = {};
  for (const key of ["cpu", "mem", "disk", "net"]) {
    charts[key] = {
      svg: document.querySelector("#chart-" + key + " svg"),
      value: document.getElementById(key + "-value"),
      summary: document.getElementById(key + "-summary"),
    };
  }

  function bytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? Math.round(n) : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
  }

  const rate = (n) => bytes(n) + "/s";
  const pct = (n) => (n < 10 ? n.toFixed(1) : Math.round(n)) + "%";

  function span(ms) {
    const s = Math.round(ms / 1000);
    return s < 120 ? s + " s" : Math.round(s / 60) + " min";
  }

  // rates turns consecutive samples of one segment into points: f(prev,
  // cur, seconds) gives a value, or null for none (a counter that went
  // back).
  function rates(f) {
    const out = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1], b = samples[i];
      const dt = (b.t - a.t) / 1000;
      if (a.seg !== b.seg || dt <= 0) continue;
      const v = f(a, b, dt);
      if (v !== null && isFinite(v)) out.push({ t: b.t, v, seg: b.seg });
    }
    return out;
  }

  function levels(f) {
    return samples.map((s) => ({ t: s.t, v: f(s), seg: s.seg })).filter((p) => p.v !== null && isFinite(p.v));
  }

  function node(tag, attrs) {
    const e = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  }

  // draw replaces chart c's contents with a grid line and one path per
  // series (a new subpath at each segment), scaled to 0..max on the time
  // span of the kept samples.
  function draw(c, series, max) {
    const t0 = samples.length ? samples[0].t : 0;
    const t1 = samples.length ? samples[samples.length - 1].t : 1;
    const x = (t) => (t1 > t0 ? ((t - t0) / (t1 - t0)) * W : W);
    const y = (v) => H - 2 - (Math.min(Math.max(v / max, 0), 1) * (H - 4));
    const kids = [node("line", { x1: 0, y1: H / 2, x2: W, y2: H / 2, class: "grid" }),
      node("line", { x1: 0, y1: H - 1, x2: W, y2: H - 1, class: "axis" })];
    for (const s of series) {
      let d = "";
      let last = null;
      for (const p of s.points) {
        d += (last === p.seg ? " L" : " M") + x(p.t).toFixed(1) + " " + y(p.v).toFixed(1);
        last = p.seg;
      }
      const top = s.points.length ? Math.max(...s.points.map((p) => p.v)) : 0;
      const path = node("path", { d: d.trim() || "M0 " + H, class: "line " + s.cls, "data-points": s.points.length, "data-max": top });
      path.setAttribute("vector-effect", "non-scaling-stroke");
      kids.push(path);
    }
    c.svg.replaceChildren(...kids);
  }

  function summary(points, fmt) {
    if (!points.length) return "no samples yet";
    const vs = points.map((p) => p.v);
    const span0 = samples.length > 1 ? samples[samples.length - 1].t - samples[0].t : 0;
    return "now " + fmt(vs[vs.length - 1]) + "; min " + fmt(Math.min(...vs)) + ", max " + fmt(Math.max(...vs)) +
      " over the last " + span(span0) + " (" + points.length + " points)";
  }

  function render() {
    const last = samples[samples.length - 1];
    if (!last) return;
    // The sandbox's vCPUs (its size; a gVisor guest may see the host's
    // CPUs), else the guest's count.
    const cpus = +box.dataset.cpus > 0 ? +box.dataset.cpus : last.cpus > 0 ? last.cpus : 1;

    const cpu = rates((a, b, dt) => (b.cpu_seconds < a.cpu_seconds ? null : Math.min(100, ((b.cpu_seconds - a.cpu_seconds) / dt / cpus) * 100)));
    draw(charts.cpu, [{ points: cpu, cls: "cpu" }], 100);
    charts.cpu.value.textContent = cpu.length ? pct(cpu[cpu.length - 1].v) + " of " + cpus + " vCPU" + (cpus > 1 ? "s" : "") : "";
    charts.cpu.summary.textContent = "CPU use, share of " + cpus + " vCPU" + (cpus > 1 ? "s" : "") + " (scale 0 to 100%): " + summary(cpu, pct) + ".";

    const mem = levels((s) => s.memory_bytes);
    draw(charts.mem, [{ points: mem, cls: "mem" }], last.memory_limit_bytes || 1);
    charts.mem.value.textContent = bytes(last.memory_bytes) + " of " + bytes(last.memory_limit_bytes);
    charts.mem.summary.textContent = "Memory used (scale 0 to " + bytes(last.memory_limit_bytes) + "): " + summary(mem, bytes) + ".";

    const disk = levels((s) => s.disk_bytes);
    draw(charts.disk, [{ points: disk, cls: "disk" }], last.disk_limit_bytes || 1);
    charts.disk.value.textContent = bytes(last.disk_bytes) + " of " + bytes(last.disk_limit_bytes);
    charts.disk.summary.textContent = "Disk used on the root filesystem (scale 0 to " + bytes(last.disk_limit_bytes) + "): " + summary(disk, bytes) + ".";

    if (!last.network) {
      draw(charts.net, [], 1);
      charts.net.value.textContent = "no network";
      charts.net.summary.textContent = "Network: the sandbox has no network.";
      return;
    }
    const counter = (k) => (a, b, dt) => (!a.network || !b.network || b.network[k] < a.network[k] ? null : (b.network[k] - a.network[k]) / dt);
    const rx = rates(counter("receive_bytes"));
    const tx = rates(counter("transmit_bytes"));
    const top = Math.max(1024, ...rx.map((p) => p.v), ...tx.map((p) => p.v));
    draw(charts.net, [{ points: rx, cls: "rx" }, { points: tx, cls: "tx" }], top);
    const now = (ps) => (ps.length ? rate(ps[ps.length - 1].v) : "–");
    charts.net.value.textContent = "↓ " + now(rx) + " ↑ " + now(tx) + ", " + last.network.connections + " conn.";
    charts.net.summary.textContent = "Network, bytes per second (scale 0 to " + rate(top) + "). Received (solid): " + summary(rx, rate) +
      ". Transmitted (dashed): " + summary(tx, rate) + ". Open connections: " + last.network.connections + ".";
  }

  async function poll() {
    if (busy || paused || document.hidden) return;
    const state = box.dataset.state;
    if (state && state !== "running") {
      broken = true;
      setStatus(status, "not sampled: the sandbox is " + state);
      return;
    }
    busy = true;
    try {
      const u = await api("GET", "/sandboxes/" + encodeURIComponent(id) + "/usage");
      if (broken) { seg++; broken = false; }
      u.t = Date.parse(u.sampled_at);
      u.seg = seg;
      if (samples.length && u.t <= samples[samples.length - 1].t) return;
      samples.push(u);
      while (samples.length > keep) samples.shift();
      render();
      box.dataset.usageSamples = String(samples.length);
      setStatus(status, "sampled " + new Date(u.t).toLocaleTimeString() + " · " + samples.length + " samples");
    } catch (e) {
      broken = true;
      setStatus(status, "usage: " + e.message, true);
    } finally {
      busy = false;
    }
  }

  toggle.addEventListener("click", () => {
    paused = !paused;
    toggle.textContent = paused ? "Start updates" : "Stop updates";
    if (paused) {
      broken = true;
      setStatus(status, "updates stopped");
    } else {
      poll();
    }
  });
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) broken = true;
    else poll();
  });

  poll();
  setInterval(poll, every);
})();
