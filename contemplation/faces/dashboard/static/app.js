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

let flashTimer = null;
function flash(text, bad) {
  const f = $("flash");
  f.textContent = text;
  f.className = bad ? "bad" : "ok";
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => { f.textContent = ""; }, 8000);
}

async function getJSON(url, signal) {
  const r = await fetch(url, { signal, headers: { Accept: "application/json", Authorization: "Bearer " + token() } });
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
// The server filters and pages (from its index); the page holds what was loaded so far and
// "more" asks for the next page with the cursor the last one ended with.
let rows = [];
let total = 0;
let nextCursor = null;
const WAITING = new Set(["awaiting_agent", "awaiting_approval"]);

function listQuery(cursor) {
  const p = new URLSearchParams({ limit: "100" });
  const q = $("search").value.trim();
  const status = $("status-filter").value;
  if (q) p.set("q", q);
  if (status) p.set("status", status);
  if (cursor) p.set("cursor", cursor);
  return "/api/conversations?" + p.toString();
}

function renderList() {
  const body = document.querySelector("#conversations tbody");
  // what waits for you first (then newest activity, as the server sends them)
  const waits = (r) => (!r.completed && WAITING.has(r.status) ? 0 : 1);
  const shown = rows.slice().sort((a, b) => waits(a) - waits(b));
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
  $("count").textContent = shown.length + " of " + total;
  $("more").hidden = !nextCursor;
}

// Run a loader one call at a time, and once more if it was asked for meanwhile: two loads in
// flight can answer out of order (an older "generating" shown after a newer "idle"), and the
// extra run makes sure what an event announced is fetched after the event.
function oneAtATime(load) {
  let running = null;
  let again = false;
  return () => {
    if (running) { again = true; return running; }
    running = (async () => {
      try {
        do { again = false; await load(); } while (again);
      } finally {
        running = null;
      }
    })();
    return running;
  };
}

// a reload keeps as many rows as were shown (pages of 100), so "more" is not undone by an event
const loadList = oneAtATime(async () => {
  const want = Math.max(rows.length, 100);
  let got = [];
  let cursor = null;
  let data = null;
  do {
    data = await getJSON(listQuery(cursor));
    got = got.concat(data.conversations);
    cursor = data.cursor;
  } while (cursor && got.length < want);
  rows = got;
  total = data.total;
  nextCursor = cursor;
  renderList();
});

const loadMore = oneAtATime(async () => {
  if (!nextCursor) return;
  const data = await getJSON(listQuery(nextCursor));
  rows = rows.concat(data.conversations);
  total = data.total;
  nextCursor = data.cursor;
  renderList();
});

// every card (contemplation/faces/dashboard/cards.py): a title and (label, text) rows, as text
const loadCards = oneAtATime(async () => {
  const data = await getJSON("/api/cards");
  const box = $("cards");
  box.replaceChildren();
  for (const c of data.cards) {
    const dl = el("dl");
    dl.id = c.name;
    for (const [k, v] of c.rows) dl.append(el("dt", null, k), el("dd", null, v));
    const section = el("section", "card");
    section.append(el("h2", null, c.title), dl);
    box.append(section);
  }
});

// -- full-text search over the logs (bounded on the server; see /api/search) --------------
let searching = null;
let searchTimer = null;

// a snippet marks its match «like this»: shown as text with <mark>, never as HTML
function markedSnippet(text) {
  const d = el("div", "snippet");
  text.split(/(«[^»]*»)/).forEach((part) => {
    if (part.startsWith("«") && part.endsWith("»")) d.append(el("mark", null, part.slice(1, -1)));
    else if (part) d.append(el("span", null, part));
  });
  return d;
}

function renderHit(h) {
  const li = el("li", "hit");
  li.dataset.id = h.conversation_id;
  const a = el("a", null, h.topic || h.conversation_id);
  a.href = "/c/" + encodeURIComponent(h.conversation_id) + "#at=" + h.at;
  const where = ["#" + h.block + " " + h.from, h.time, h.archived ? "archived" : h.status, h.relevance];
  li.append(a, el("span", "where", " " + where.filter(Boolean).join(" · ")), markedSnippet(h.snippet));
  return li;
}

function renderHits(data) {
  // by meaning nothing is close: said before the nearest, as the CLI says it
  $("text-close").textContent = data.nothing_close && data.count ? "nothing close to " +
    JSON.stringify($("search").value.trim()) + "; nearest:" : "";
  $("text-close").hidden = !$("text-close").textContent;
  $("text-note").textContent = data.count + " block" + (data.count === 1 ? "" : "s") +
    " · best first" + (data.count >= 50 ? " · the first 50" : "") + (data.cut ? " · " + data.cut : "") +
    (data.mode ? " · by " + (data.mode === "both" ? "words and meaning" : data.mode) : "") +
    (data.note ? " · " + data.note : "") + (data.not_embedded ? " · " + data.not_embedded : "");
  $("text-hits").replaceChildren(...data.hits.map(renderHit));
  $("text-results").hidden = false;
}

async function fullText() {
  const q = $("search").value.trim();
  if (searching) searching.abort();
  if (q.length < 2) { $("text-results").hidden = true; return; }
  searching = new AbortController();
  try {
    const mode = $("search-mode").value;
    const url = "/api/search?q=" + encodeURIComponent(q) + (mode ? "&mode=" + mode : "");
    renderHits(await getJSON(url, searching.signal));
  } catch (e) {
    if (e.name !== "AbortError") flash("search: " + e.message, true);
  }
}

function listPage() {
  $("list-page").hidden = false;
  $("search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { rows = []; loadList().catch((e) => flash(e.message, true)); fullText(); }, 250);
  });
  $("status-filter").addEventListener("change", () => { rows = []; loadList().catch((e) => flash(e.message, true)); });
  $("search-mode").addEventListener("change", fullText);
  $("more").addEventListener("click", () => loadMore().catch((e) => flash(e.message, true)));
  let timer = null;
  const refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(() => { loadList().catch(() => {}); loadCards().catch(() => {}); }, 150);
  };
  const es = new EventSource("/api/events?token=" + encodeURIComponent(token()));
  for (const ev of ["message", "reply", "generating", "error", "retrying", "cancelled", "archived",
    "rejected", "awaiting_agent", "awaiting_approval", "need_answered", "resync"]) {
    es.addEventListener(ev, refresh);
  }
  loadList().catch((e) => flash(e.message, true));
  loadCards().catch(() => {});
  setInterval(refresh, 10000);
}

// -- the conversation page ---------------------------------------------------------------
let convId = "";
let cursor = 0;

// a block still being written (the partial reply) is shown without "fork here": a fork is of
// finished blocks; the button comes with the block once it is finished
function renderBlock(b, finished = true) {
  if (b.kind === "marker") return el("div", "marker", b.marker + (b.text ? ": " + b.text : ""));
  const box = el("article", "block " + b.kind);
  box.dataset.offset = b.offset;
  box.append(el("header", null, b.from + " → " + b.to + " · " + b.time));
  if (b.thinking) {
    const d = el("details", "thinking");
    d.append(el("summary", null, "thinking"), el("pre", null, b.thinking));
    box.append(d);
  }
  box.append(el("pre", "text", b.text));  // its NEED lines are in the text: shown once
  for (const [k, t] of b.markers || []) box.append(el("div", "marker", k + (t ? ": " + t : "")));
  if (!finished) return box;
  const fork = el("button", "fork", "fork here");
  fork.title = "a new conversation with the blocks up to this one";
  fork.addEventListener("click", () => forkAt(b.offset, fork));
  box.append(fork);
  return box;
}

// a panel's round side by side: consecutive replies of different seats share one row. The
// seats come with the detail, which may answer after the first blocks were placed (an event
// can load them first): when the seats change, the blocks are laid out again from the start
let panelSeats = new Set();
let seatKey = "";  // the seats known now
let placedKey = "";  // the seats the blocks on the page were laid out for
function learnSeats(panel) {
  const labels = (panel || []).map((s) => s.label);
  if (labels.join("\n") === seatKey) return;
  seatKey = labels.join("\n");
  panelSeats = new Set(labels);
  loadBlocks().catch(() => {});
}
function place(log, box, b) {
  box.dataset.from = b.from || "";
  const last = log.lastElementChild;
  if (b.kind === "model" && panelSeats.has(b.from) && last) {
    if (last.classList.contains("round") && !last.querySelector(`[data-from="${CSS.escape(b.from)}"]`)) {
      last.append(box);
      return;
    }
    if (last.matches("article.model") && panelSeats.has(last.dataset.from) && last.dataset.from !== b.from) {
      const round = el("div", "round");
      log.replaceChild(round, last);
      round.append(last, box);
      return;
    }
  }
  log.append(box);
}

async function forkAt(offset, button) {
  button.disabled = true;
  try {
    const made = await post("/api/conversations/" + encodeURIComponent(convId) + "/fork", { offset });
    flash("forked into " + made.id + " (blocks 1.." + made.blocks + ")");
    location.assign("/c/" + encodeURIComponent(made.id));
  } catch (err) {
    flash("refused: " + err.message, true);
  }
  button.disabled = false;
}

const loadBlocks = oneAtATime(async () => {
  const key = seatKey;
  const since = key === placedKey ? cursor : 0;  // laid out for other seats: all again
  const d = await getJSON("/api/conversations/" + encodeURIComponent(convId) + "/blocks?since=" + since);
  if (seatKey !== key) {  // the seats came meanwhile: fetched again for them, placed once
    loadBlocks().catch(() => {});
    return;
  }
  const log = $("log");
  if (d.reset || since === 0) log.replaceChildren();
  for (const b of d.blocks) place(log, renderBlock(b), b);
  placedKey = key;
  cursor = d.cursor;
  showHit();
  const live = $("live");
  if (d.partial) {
    live.hidden = false;
    live.replaceChildren(renderBlock(d.partial, false));
    live.dataset.streaming = "1";
  } else if (d.blocks.length) {
    live.hidden = true;
    live.replaceChildren();
  }
});

// a search result links to #at=<byte offset>: mark the block that holds it, once
let hitShown = false;
function showHit() {
  const m = location.hash.match(/at=(\d+)/);
  if (hitShown || !m) return;
  const at = Number(m[1]);
  let found = null;
  for (const b of document.querySelectorAll("#log article[data-offset]")) {
    if (Number(b.dataset.offset) <= at) found = b;
  }
  if (!found) return;
  hitShown = true;
  found.classList.add("hit");
  found.scrollIntoView({ block: "center" });
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

const loadDetail = oneAtATime(async () => {
  showDetail(await getJSON("/api/conversations/" + encodeURIComponent(convId)));
});

// while a turn runs the header's activity (tokens so far, tok/s, for how long) is read again
// each second, as `status` would say it now; one timer, none once the turn is over
const TICK_MS = 1000;
let tick = null;
function ticking(status) {
  clearTimeout(tick);
  tick = null;
  if (["generating", "routing", "retrying"].includes(status)) {
    tick = setTimeout(() => loadDetail().catch(() => {}), TICK_MS);
  }
}

function showDetail(c) {
  $("conv-title").textContent = c.topic || c.id;
  document.title = (c.topic || c.id) + " · contemplation";
  learnSeats(c.panel);
  const models = (c.panel || []).length
    ? "panel: " + c.panel.map((s) => s.label + " (" + (s.backend || c.backend) + "/" + s.model + ")").join(", ")
    : c.backend + "/" + c.model;
  $("conv-meta").textContent = [c.id, models, "status: " + c.status,
    "turns: " + c.turns, c.completed ? "archived" : "",
    c.forked_from ? "forked from " + c.forked_from.id + " at block " + c.forked_from.block : "",
    c.activity || ""].filter(Boolean).join(" · ");
  $("conv-meta").dataset.status = c.status;
  ticking(c.status);
  const can = new Set(c.actions || []);
  // the one list of what waits: a lookup is decided with buttons (the tool answers it, never
  // the agent's text), a need is answered in a box; each posts its item's stable id
  const waiting = c.waiting || [];
  renderApprovals(can.has("approve") ? waiting.filter((w) => w.kind === "approval") : []);
  renderNeeds(can.has("respond") ? waiting.filter((w) => w.kind === "need") : []);
  renderDecisions(c.completed ? [] : c.decisions || []);
  const cancel = $("cancel");
  cancel.hidden = !can.has("cancel");
  cancel.disabled = !!c.cancel_requested;
  cancel.textContent = c.cancel_requested ? "cancelling…" : "cancel the turn";
  $("send-form").hidden = !can.has("messages");
  $("archive").hidden = !can.has("archive");
}

// one form per need to answer; kept as they are (with what is typed) while the list is unchanged
let shownNeeds = "[]";
function renderNeeds(needs) {
  const key = JSON.stringify(needs.map((n) => n.id));
  $("needs").hidden = needs.length === 0;
  if (key === shownNeeds) return;
  shownNeeds = key;
  $("need-forms").replaceChildren(...needs.map(needForm));
}

function needForm(item) {
  const need = item.need;
  const f = el("form", "need-form");
  f.dataset.need = need;
  f.dataset.id = item.id;
  const box = el("textarea", "need-answer");
  box.rows = 3;
  box.setAttribute("aria-label", "answer to: " + need);
  box.placeholder = "your answer";
  const button = el("button", null, "answer");
  button.type = "submit";
  f.append(el("div", "need", "NEED: " + need), box, button);
  f.addEventListener("submit", async (e) => {
    e.preventDefault();
    button.disabled = true;
    try {
      const r = await post(convBase() + "/respond", { need: item.id, text: box.value });
      flash("answered: " + r.answered);
      f.classList.add("sent");
      await loadDetail();
    } catch (err) {
      flash("refused: " + err.message, true);
    } finally {
      button.disabled = false;
    }
  });
  return f;
}

// the decisions made about lookups: who made each and when; an "always" still standing can be
// revoked (the next such lookup is asked again)
let shownDecisions = "";
function renderDecisions(list) {
  let box = $("decisions");
  if (!box) {
    box = el("section");
    box.id = "decisions";
    box.className = "decisions";
    box.append(el("h2", null, "decisions about lookups"), el("div", "decision-rows"));
    $("needs").before(box);
  }
  box.hidden = list.length === 0;
  const key = JSON.stringify(list.map((d) => [d.id, d.standing]));
  if (key === shownDecisions) return;
  shownDecisions = key;
  box.querySelector(".decision-rows").replaceChildren(...list.map(decisionRow));
}

function decisionRow(d) {
  const row = el("div", "decision");
  row.dataset.id = d.id;
  const said = d.revoked ? " · revoked by " + d.revoked_by + " at " + d.revoked : "";
  row.append(el("div", "tool", d.decision + ": " + d.tool + " " + JSON.stringify(d.arguments)),
    el("div", "note", "by " + d.by + " at " + (d.time || "?") + said));
  if (d.standing) {
    const b = el("button", "danger", "revoke");
    b.type = "button";
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        await post(convBase() + "/revoke", { id: d.id });
        flash("revoked: " + d.tool + " " + JSON.stringify(d.arguments));
        await loadDetail();
      } catch (err) {
        flash("refused: " + err.message, true);
        b.disabled = false;
      }
    });
    row.append(b);
  }
  return row;
}

// lookups the permissions ask about (approval items of the list): one row each, approve once /
// always, or reject
let shownApprovals = "[]";
function renderApprovals(requests) {
  let box = $("approvals");
  if (!box) {
    box = el("section");
    box.id = "approvals";
    box.className = "approvals";
    box.append(el("h2", null, "lookups waiting for your approval"), el("div", "approval-rows"));
    $("needs").before(box);
  }
  box.hidden = requests.length === 0;
  const key = JSON.stringify(requests.map((r) => r.id));
  if (key === shownApprovals) return;
  shownApprovals = key;
  box.querySelector(".approval-rows").replaceChildren(...requests.map(approvalRow));
}

function approvalRow(r) {
  const row = el("div", "approval");
  row.dataset.request = r.id;
  row.append(el("div", "need", "NEED: " + r.need),
    el("div", "tool", r.tool + " " + JSON.stringify(r.arguments)),
    el("div", "note", "asked by " + r.why));
  const done = { once: "approved once", always: "approved always", reject: "rejected" };
  const buttons = [["once", "approve once"], ["always", "always approve"], ["reject", "reject"]].map(
    ([decision, label]) => {
      const b = el("button", decision === "reject" ? "danger" : null, label);
      b.type = "button";
      b.dataset.decision = decision;
      b.addEventListener("click", async () => {
        for (const x of buttons) x.disabled = true;
        try {
          const res = await post(convBase() + "/approve", { need: r.id, decision });
          flash(done[decision] + ": " + res.need);
          row.classList.add("sent");
          await loadDetail();
        } catch (err) {
          flash("refused: " + err.message, true);
          for (const x of buttons) x.disabled = false;
        }
      });
      return b;
    });
  const bar = el("div", "toolbar");
  bar.append(...buttons);
  row.append(bar);
  return row;
}

function convBase() {
  return "/api/conversations/" + encodeURIComponent(convId);
}

async function cancelTurn() {
  const b = $("cancel");
  b.disabled = true;
  try {
    const r = await post(convBase() + "/cancel", {});
    flash("cancel requested (it was " + r.cancelling + ")");
    b.textContent = "cancelling…";
  } catch (err) {
    flash("refused: " + err.message, true);
    b.disabled = false;
  }
  loadDetail().catch(() => {});
}

function convPage(id) {
  convId = id;
  $("conv-page").hidden = false;
  const base = "/api/conversations/" + encodeURIComponent(id);
  const t = "?token=" + encodeURIComponent(token());  // a download link cannot send headers
  $("export-md").href = base + "/export.md" + t;
  $("export-md").setAttribute("download", id + ".md");
  $("export-json").href = base + "/export.json" + t;
  $("export-json").setAttribute("download", id + ".json");
  $("send-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const r = await post(base + "/messages", { text: $("message").value });
      $("message").value = "";
      const left = (r.left_unanswered || []).map((i) => i.need);
      flash(left.length ? "queued; left unanswered: " + left.join("; ") : "queued");
    } catch (err) {
      flash("refused: " + err.message, true);
    }
  });
  $("cancel").addEventListener("click", cancelTurn);
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
  es.addEventListener("generating", () => {
    $("live").replaceChildren();
    streamToken("");
    loadDetail().catch(() => {});
  });
  for (const ev of ["message", "reply", "error", "retrying", "cancelled", "note", "archived", "rejected",
    "awaiting_agent", "awaiting_approval", "need_answered", "resync", "hello"]) {
    es.addEventListener(ev, () => { loadBlocks().catch(() => {}); loadDetail().catch(() => {}); });
  }
  // the detail first: a panel's seats decide how the blocks are laid out
  loadDetail().catch((e) => flash(e.message, true)).finally(() => {
    loadBlocks().catch((e) => flash(e.message, true));
  });
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
