// Shared by the dashboard's pages: calls to the /v1 API with the session
// cookie (the browser sends it) and, on state-changing calls, the CSRF
// token the page was given. Guest data goes into the page as text only.
"use strict";

const airlock = (() => {
  const meta = document.querySelector('meta[name="airlock-csrf"]');
  const csrf = meta ? meta.content : "";

  // api calls /v1 and returns the decoded JSON body (null if none); an
  // error answer throws an Error with the API's message. A 401 (the
  // session ended, or its key was revoked) goes back to the sign-in page.
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (method !== "GET" && method !== "HEAD") headers["X-Airlock-CSRF"] = csrf;
    const init = { method, headers, credentials: "same-origin", cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch("/v1" + path, init);
    if (res.status === 401) {
      window.location.assign("/ui/sign-in");
      throw new Error("signed out");
    }
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = null; }
    }
    if (!res.ok) {
      const msg = data && data.error ? data.error.message + " (" + data.error.code + ")" : "HTTP " + res.status;
      throw new Error(msg);
    }
    return data;
  }

  // el makes an element with text content and attributes.
  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  // duration formats seconds as "3d 4h", "2h 5m", "4m 10s" or "9s".
  function duration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "";
    s = Math.max(0, Math.floor(s));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + r + "s";
    return r + "s";
  }

  // lifetimeLeft is the running time a sandbox has left, in seconds.
  function lifetimeLeft(sb, now) {
    if (sb.lifetime_left_s !== undefined && sb.lifetime_left_s !== null) return sb.lifetime_left_s;
    if (!sb.expires_at) return null;
    return (Date.parse(sb.expires_at) - now) / 1000;
  }

  function metadataText(md) {
    return Object.entries(md || {}).map(([k, v]) => k + "=" + v).join(", ");
  }

  function setStatus(node, text, bad) {
    node.textContent = text;
    node.classList.toggle("bad", !!bad);
  }

  return { api, el, duration, lifetimeLeft, metadataText, setStatus, csrf };
})();
