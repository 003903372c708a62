// contemplation dashboard. No framework, no build step. Model output is text: it is only
// ever put into the page with textContent (never innerHTML).
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

// -- the token: from #token=… once (then kept for the tab), or typed in ------------------
function token() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("token") || "";
}

function flash(text, bad) {
  const f = $("flash");
  f.textContent = text;
  f.className = bad ? "bad" : "ok";
}

async function getJSON(url) {
  const r = await fetch(url, { headers: { Accept: "application/json", Authorization: "Bearer " + token() } });
  if (!r.ok) throw new Error((await r.json().catch(() => ({}))).error || r.statusText);
  return r.json();
}

async function post(url, body) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + token() },
    body: JSON.stringify(body || {}),
  });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

async function daemonPill() {
  try {
    const h = await getJSON("/health");
    $("daemon").textContent = h.daemon_alive ? "daemon running" : "daemon stopped";
    $("daemon").className = "pill " + (h.daemon_alive ? "ok" : "bad");
  } catch (e) {
    $("daemon").textContent = "offline";
    $("daemon").className = "pill bad";
  }
}

// -- the list page -----------------------------------------------------------------------
let rows = [];

function matches(r, q, status) {
  if (status === "archived" && !r.completed) return false;
  if (status === "active" && r.completed) return false;
  if (status && status !== "archived" && status !== "active" && r.status !== status) return false;
  if (!q) return true;
  return [r.id, r.topic, r.model, r.backend, r.status].join(" ").toLowerCase().includes(q);
}

function renderList() {
  const q = $("search").value.trim().toLowerCase();
  const status = $("status-filter").value;
  const body = document.querySelector("#conversations tbody");
  const shown = rows.filter((r) => matches(r, q, status));
  const frag = document.createDocumentFragment();
  for (const r of shown) {
    const tr = el("tr");
    tr.dataset.id = r.id;
    const a = el("a", null, r.topic || r.id);
    a.href = "/c/" + encodeURIComponent(r.id);
    const td = el("td");
    td.append(a, el("div", "id", r.id));
    const st = el("td", "status s-" + r.status, r.completed ? r.status + " (archived)" : r.status);
    if (r.pending_needs && r.pending_needs.length) st.title = r.pending_needs.join("\n");
    tr.append(td, st, el("td", null, r.model), el("td", null, r.backend),
      el("td", "num", r.turns), el("td", null, r.last_activity));
    frag.append(tr);
  }
  body.replaceChildren(frag);
  $("count").textContent = shown.length + " of " + rows.length;
}

async function loadList() {
  const data = await getJSON("/api/conversations");
  rows = data.conversations;
  renderList();
}

async function loadMetrics() {
  const m = await getJSON("/api/metrics");
  const live = m.live;
  const items = [
    ["conversations", m.conversations],
    ["turns (all time)", m.turns_total],
    ["turns (this run)", live.turns],
    ["response p50 / p90 / p99 (ms)",
      ["p50", "p90", "p99"].map((k) => live.response_ms[k] === null ? "–" : Math.round(live.response_ms[k])).join(" / ")],
    ["tokens prompt / completion", live.tokens.prompt + " / " + live.tokens.completion],
    ["errors / retries (this run)", live.errors + " / " + live.retries],
    ["in error / retrying now", m.errors_now + " / " + m.retrying_now],
    ["tool requests", Object.entries(live.tool_requests).map(([k, v]) => k + ": " + v).join(", ") || "–"],
  ];
  const dl = $("metrics");
  dl.replaceChildren();
  for (const [k, v] of items) dl.append(el("dt", null, k), el("dd", null, v));
}

function listPage() {
  $("list-page").hidden = false;
  $("search").addEventListener("input", renderList);
  $("status-filter").addEventListener("change", renderList);
  let timer = null;
  const refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(() => { loadList().catch(() => {}); loadMetrics().catch(() => {}); }, 150);
  };
  const es = new EventSource("/api/events?token=" + encodeURIComponent(token()));
  for (const ev of ["message", "reply", "generating", "error", "retrying", "cancelled", "archived", "rejected", "resync"]) {
    es.addEventListener(ev, refresh);
  }
  loadList().catch((e) => flash(e.message, true));
  loadMetrics().catch(() => {});
  setInterval(refresh, 10000);
}

// -- the conversation page ---------------------------------------------------------------
let convId = "";
let cursor = 0;
let loading = false;
let again = false;

function renderBlock(b) {
  if (b.kind === "marker") return el("div", "marker", b.marker + (b.text ? ": " + b.text : ""));
  const box = el("article", "block " + b.kind);
  box.dataset.offset = b.offset;
  box.append(el("header", null, b.from + " → " + b.to + " · " + b.time));
  if (b.thinking) {
    const d = el("details", "thinking");
    d.append(el("summary", null, "thinking"), el("pre", null, b.thinking));
    box.append(d);
  }
  box.append(el("pre", "text", b.text));
  for (const n of b.needs || []) box.append(el("div", "need", "NEED: " + n));
  for (const [k, t] of b.markers || []) box.append(el("div", "marker", k + (t ? ": " + t : "")));
  return box;
}

async function loadBlocks() {
  if (loading) { again = true; return; }
  loading = true;
  try {
    do {
      again = false;
      const d = await getJSON("/api/conversations/" + encodeURIComponent(convId) + "/blocks?since=" + cursor);
      const log = $("log");
      if (d.reset) log.replaceChildren();
      for (const b of d.blocks) log.append(renderBlock(b));
      cursor = d.cursor;
      const live = $("live");
      if (d.partial) {
        live.hidden = false;
        live.replaceChildren(renderBlock(d.partial));
        live.dataset.streaming = "1";
      } else if (d.blocks.length) {
        live.hidden = true;
        live.replaceChildren();
      }
    } while (again);
  } finally {
    loading = false;
  }
}

function streamToken(text) {
  const live = $("live");
  let pre = live.querySelector("pre.text");
  if (!pre) {
    live.replaceChildren(el("article", "block model streaming"));
    pre = el("pre", "text", "");
    live.firstChild.append(el("header", null, "replying…"), pre);
  }
  live.hidden = false;
  pre.textContent += text;
}

async function loadDetail() {
  const c = await getJSON("/api/conversations/" + encodeURIComponent(convId));
  $("conv-title").textContent = c.topic || c.id;
  document.title = (c.topic || c.id) + " · contemplation";
  $("conv-meta").textContent = [c.id, c.backend + "/" + c.model, "status: " + c.status,
    "turns: " + c.turns, c.completed ? "archived" : ""].filter(Boolean).join(" · ");
  $("conv-meta").dataset.status = c.status;
  const sel = $("need-select");
  sel.replaceChildren(el("option", null, "(plain message)"));
  sel.firstChild.value = "";
  (c.pending_needs || []).forEach((n, i) => {
    const o = el("option", null, n);
    o.value = String(i + 1);
    sel.append(o);
  });
  if (c.pending_needs && c.pending_needs.length) sel.value = "1";
  $("needs").hidden = !(c.pending_needs && c.pending_needs.length);
  $("send-form").hidden = !!c.completed;
  $("archive").hidden = !!c.completed;
}

function convPage(id) {
  convId = id;
  $("conv-page").hidden = false;
  const base = "/api/conversations/" + encodeURIComponent(id);
  $("export-md").href = base + "/export.md";
  $("export-md").setAttribute("download", id + ".md");
  $("export-json").href = base + "/export.json";
  $("export-json").setAttribute("download", id + ".json");
  $("send-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = $("message").value;
    const need = $("needs").hidden ? "" : $("need-select").value;
    try {
      const r = need
        ? await post(base + "/respond", { text, need })
        : await post(base + "/messages", { text });
      $("message").value = "";
      flash(r.answered ? "answered: " + r.answered : "queued");
    } catch (err) {
      flash("refused: " + err.message, true);
    }
  });
  $("archive").addEventListener("click", async () => {
    try {
      await post(base + "/archive", {});
      flash("archived");
      loadDetail().catch(() => {});
    } catch (err) {
      flash("refused: " + err.message, true);
    }
  });
  const es = new EventSource("/api/events?conv=" + encodeURIComponent(id) + "&token=" + encodeURIComponent(token()));
  es.addEventListener("token", (e) => streamToken(JSON.parse(e.data).text || ""));
  es.addEventListener("generating", () => { $("live").replaceChildren(); streamToken(""); });
  for (const ev of ["message", "reply", "error", "retrying", "cancelled", "note", "archived", "rejected", "resync", "hello"]) {
    es.addEventListener(ev, () => { loadBlocks().catch(() => {}); loadDetail().catch(() => {}); });
  }
  loadDetail().catch((e) => flash(e.message, true));
  loadBlocks().catch((e) => flash(e.message, true));
}

// -- start -------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  const t = $("token");
  t.value = token();
  t.addEventListener("change", () => sessionStorage.setItem("token", t.value.trim()));
  daemonPill();
  setInterval(daemonPill, 10000);
  const m = location.pathname.match(/^\/c\/([^/]+)$/);
  if (m) convPage(decodeURIComponent(m[1]));
  else listPage();
});
