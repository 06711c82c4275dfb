// The operator's dashboard of a mooncake-py master. It reads and acts only through the memory
// API (/v1/memory/...) of the HTTP port that served it. Plain ES2020, no framework, no build
// step: the master serves it with `Content-Security-Policy: default-src 'self'`, so nothing is
// inline, nothing is evaluated, and every element is built with the DOM API (session ids are
// client-chosen text and must never be parsed as HTML).
"use strict";

// ---- configuration (query string) ------------------------------------------------------------
const query = new URLSearchParams(window.location.search);

/** Reads a positive integer query parameter, clamped to [low, high]; `fallback` otherwise. */
function intParam(name, fallback, low, high) {
  const value = Number.parseInt(query.get(name) ?? "", 10);
  return Number.isFinite(value) ? Math.min(high, Math.max(low, value)) : fallback;
}

// ?refresh=ms: how often the page polls (2 s by default; 250 ms floor so a typo cannot flood
// the master). ?page_size=N: sessions asked per page of the listing (the API's limit).
const REFRESH_MS = intParam("refresh", 2000, 250, 3_600_000);
const PAGE_SIZE = intParam("page_size", 1000, 1, 4096);
const TOKEN_KEY = "mooncake-py.dashboard.token";
// The master keeps 720 samples; a tenant view (no server history) keeps as many of its own.
const MAX_LOCAL_SAMPLES = 720;
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  // What the last poll read.
  sessions: [], sessionTotals: null, lastStats: null, localSamples: [],
  // How the table is shown; sortKey null is the API's order (session id).
  sortKey: null, sortDescending: true, filter: "all",
  // Polling: one poll at a time, none while the token prompt is up.
  refreshing: false, refreshAgain: false, awaitingToken: false, timer: 0, refreshes: 0,
};

const $ = (id) => document.getElementById(id);

// ---- API calls --------------------------------------------------------------------------------
/** A call answered 401: the page asks for a token and retries. */
class AuthRequired extends Error {}

/** A call answered another error status; `message` is the master's own explanation. */
class ApiError extends Error {
  constructor(status, payload) {
    const detail = payload && (payload.error_message || payload.error);
    super(detail ? `${detail} (HTTP ${status})` : `HTTP ${status}`);
    this.status = status;
  }
}

/**
 * GETs `path`, or POSTs `body` as JSON when given. The stored token, if any, goes as Bearer.
 * Resolves to the parsed JSON answer; rejects with AuthRequired on 401, ApiError otherwise.
 */
async function api(path, body) {
  const headers = { Accept: "application/json" };
  const token = window.sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { headers, cache: "no-store" };
  if (body !== undefined) {
    // The master refuses POSTs of any other type: a cross-site form cannot send this one
    // without a preflight, which is what keeps the release calls safe from CSRF.
    headers["Content-Type"] = "application/json";
    init.method = "POST";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  // A body that is not JSON (a proxy's HTML error page) is reported by its status alone.
  const payload = await response.json().catch(() => null);
  if (response.status === 401) throw new AuthRequired();
  if (!response.ok) throw new ApiError(response.status, payload);
  return payload;
}

/**
 * The sessions the table shows, in one call. Sorted by a column, the master ranks every
 * session of the tenant by it (with the filter) and answers the first PAGE_SIZE; unsorted, the
 * first PAGE_SIZE in id order. Either way a refresh costs the master one walk of the sessions,
 * however many there are, and the totals (over all of them) come with the answer.
 */
async function loadSessions() {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (state.sortKey) {
    params.set("sort", state.sortKey);
    params.set("order", state.sortDescending ? "desc" : "asc");
  }
  if (state.filter !== "all") params.set("pinned", String(state.filter === "pinned"));
  const answer = await api(`/v1/memory/sessions?${params}`);
  return { totals: answer, sessions: answer.sessions };
}

// ---- formatting -------------------------------------------------------------------------------
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/** 1536 -> "1.50 KiB": three significant digits in binary units. */
function formatBytes(bytes) {
  if (!Number.isFinite(bytes)) return "–";
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${bytes} B`;
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

const exactBytes = (bytes) => `${Number(bytes).toLocaleString("en-US")} bytes`;
const bothBytes = (bytes) => `${formatBytes(bytes)} (${exactBytes(bytes)})`;
const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;

/** 8_520_000 ms -> "2 h 22 min": the two largest units are what an operator compares. */
function formatIdle(ms) {
  const seconds = Math.floor(ms / 1000);
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${seconds % 60} s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return `${hours} h ${minutes % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

const clock = (unixSeconds) => new Date(unixSeconds * 1000).toLocaleTimeString("en-GB");

/** An element with text (never parsed as HTML), classes and attributes. */
function el(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

/** A byte figure shown in binary units, the exact count in its title (hover) and data-bytes. */
function setBytes(node, bytes) {
  node.textContent = formatBytes(bytes);
  node.title = exactBytes(bytes);
  node.dataset.bytes = String(bytes);
}

function showStatus(text, kind = "ok", freedBytes = null) {
  const line = $("status-line");
  line.textContent = text;
  line.className = `status ${kind}`;
  if (freedBytes === null) delete line.dataset.freedBytes;
  else line.dataset.freedBytes = String(freedBytes);
}

// ---- headline figures -------------------------------------------------------------------------
function renderStats(stats) {
  $("view-label").textContent = stats.view === "tenant" ? "tenant view" : "global view";
  const figure = (id, value) => {
    $(id).textContent = Number(value).toLocaleString("en-US");
    $(id).dataset.value = String(value);
  };
  figure("stat-objects", stats.objects);
  figure("stat-sessions", stats.sessions);
  figure("stat-pinned", stats.pinned_sessions);
  const allocated = $("stat-allocated");
  allocated.textContent = `${formatBytes(stats.allocated_bytes)} / ${formatBytes(stats.capacity_bytes)}`;
  allocated.title = `${exactBytes(stats.allocated_bytes)} of ${exactBytes(stats.capacity_bytes)}`;
  Object.assign(allocated.dataset, { allocated: stats.allocated_bytes, capacity: stats.capacity_bytes });
  const percent = stats.capacity_bytes ? (100 * stats.allocated_bytes) / stats.capacity_bytes : 0;
  $("stat-allocated-percent").textContent = `${percent.toFixed(1)} % used`;
  renderDisk(stats.disk);
  const kvState = $("stat-kv-state");
  kvState.textContent = stats.kv_cache_state === "awake" ? "awake" : "released";
  kvState.dataset.value = stats.kv_cache_state;
  kvState.classList.toggle("kv-released", stats.kv_cache_state !== "awake");
  $("updated-at").textContent = `updated ${clock(stats.timestamp)} · every ${REFRESH_MS / 1000} s`;
}

/** The disk tier's headline: its bytes against its quota and, in the global view, what moved. */
function renderDisk(disk) {
  const node = $("stat-disk");
  const mounted = Boolean(disk && disk.segments);
  const [used, quota] = disk ? [disk.used_bytes, disk.capacity_bytes] : [0, 0];
  node.textContent = mounted ? `${formatBytes(used)} / ${formatBytes(quota)}` : "–";
  node.title = mounted ? `${exactBytes(used)} of ${exactBytes(quota)}` : "no disk tier mounted";
  Object.assign(node.dataset, { used, capacity: quota, segments: disk ? disk.segments : 0 });
  const percent = quota ? (100 * used) / quota : 0;
  $("stat-disk-fill").style.width = `${Math.min(100, percent).toFixed(2)}%`;
  const moved = mounted && disk.spilled_objects !== undefined ? ` · ${plural(disk.spilled_objects, "spill")}, ${plural(disk.promoted_objects, "promotion")}` : "";
  $("stat-disk-detail").textContent = mounted ? `${percent.toFixed(1)} % used${moved}` : "no disk tier";
}

// ---- occupancy chart --------------------------------------------------------------------------
/**
 * The series to draw: the master's history in the global view, followed by the samples this
 * page polled since the master's last one (so the line moves between the master's samples);
 * in a tenant view, which has no server history, only the samples this page polled itself.
 */
function occupancySeries(stats) {
  const now = { t: stats.timestamp, allocated: stats.allocated_bytes, capacity: stats.capacity_bytes };
  const local = state.localSamples;
  if (!local.length || local[local.length - 1].t < now.t) local.push(now);
  if (local.length > MAX_LOCAL_SAMPLES) local.splice(0, local.length - MAX_LOCAL_SAMPLES);
  const history = Array.isArray(stats.history) ? stats.history : [];
  if (stats.view !== "global" || !history.length) return local;
  const series = history.map((s) => ({ t: s.t, allocated: s.allocated_bytes, capacity: s.capacity_bytes }));
  const last = series[series.length - 1].t;
  return series.concat(local.filter((s) => s.t > last));
}

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function renderChart(series) {
  const chart = $("occupancy-chart");
  // Drawn in CSS pixels of its current box, so text keeps its size whatever the width.
  const width = Math.max(chart.clientWidth, 300);
  const height = Math.max(chart.clientHeight, 160);
  const [left, right, top, bottom] = [70, 12, 10, 22]; // room for the axis labels
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const nodes = [];
  const peak = Math.max(1, ...series.map((s) => Math.max(s.capacity, s.allocated)));
  const yMax = peak * 1.05;
  const t0 = series.length ? series[0].t : 0;
  const t1 = series.length ? series[series.length - 1].t : 1;
  const span = Math.max(t1 - t0, 1e-9);
  const x = (t) => (series.length < 2 ? left : left + ((t - t0) / span) * (width - left - right));
  const y = (bytes) => top + (1 - bytes / yMax) * (height - top - bottom);
  for (let i = 0; i <= 4; i += 1) {
    const bytes = (peak * i) / 4;
    nodes.push(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(bytes), y2: y(bytes) }));
    nodes.push(svg("text", { class: "axis-label", x: left - 6, y: y(bytes) + 4, "text-anchor": "end" }, formatBytes(Math.round(bytes))));
  }
  if (series.length) {
    nodes.push(svg("text", { class: "axis-label", x: left, y: height - 4 }, clock(t0)));
    nodes.push(svg("text", { class: "axis-label", x: width - right, y: height - 4, "text-anchor": "end" }, clock(t1)));
    // One sample is drawn as a flat line across, so a fresh master still shows its level.
    const points = series.length < 2 ? [series[0], { ...series[0], t: t0 + span }] : series;
    const xs = series.length < 2 ? [left, width - right] : points.map((s) => x(s.t));
    const path = (key) => points.map((s, i) => `${i ? "L" : "M"}${xs[i].toFixed(1)},${y(s[key]).toFixed(1)}`).join(" ");
    const base = y(0).toFixed(1);
    const area = `${path("allocated")} L${xs[xs.length - 1].toFixed(1)},${base} L${xs[0].toFixed(1)},${base} Z`;
    nodes.push(svg("path", { class: "area-allocated", d: area }));
    nodes.push(svg("path", { class: "line-capacity", d: path("capacity"), "data-testid": "line-capacity" }));
    nodes.push(svg("path", { class: "line-allocated", d: path("allocated"), "data-testid": "line-allocated" }));
  }
  chart.replaceChildren(...nodes);
  chart.dataset.samples = String(series.length);
  $("occupancy-samples").textContent = plural(series.length, "sample");
}

// ---- segments ---------------------------------------------------------------------------------
function renderSegments(answer) {
  const rows = answer.segments.map((segment) => {
    const percent = segment.capacity_bytes ? (100 * segment.used_bytes) / segment.capacity_bytes : 0;
    const row = el("div", null, { class: "segment", "data-testid": "segment-row" });
    const tier = segment.tier || "memory";
    Object.assign(row.dataset, { segmentName: segment.name, tier, usedBytes: segment.used_bytes, capacityBytes: segment.capacity_bytes });
    const head = el("div", null, { class: "segment-head" });
    const status = segment.status && segment.status !== "OK" ? ` · ${segment.status}` : "";
    const name = el("span", `${segment.name}${status}`, { class: "segment-name" });
    name.append(el("span", tier, { class: `tier-tag ${tier}`, "data-testid": "segment-tier" }));
    name.title = `segment ${segment.segment_id} of client ${segment.client_id} at ${segment.te_endpoint}`;
    const figures = el("span", `${formatBytes(segment.used_bytes)} / ${formatBytes(segment.capacity_bytes)} · ${percent.toFixed(1)} %`, { class: "segment-figures" });
    figures.title = `${exactBytes(segment.used_bytes)} of ${exactBytes(segment.capacity_bytes)}`;
    head.append(name, figures);
    const fill = el("div", null, { class: "bar-fill" });
    // The width goes through the CSSOM, which CSP allows, not a style attribute, which it does not.
    fill.style.width = `${Math.min(100, percent).toFixed(2)}%`;
    fill.classList.toggle("high", percent >= 80 && percent < 95);
    fill.classList.toggle("full", percent >= 95);
    fill.classList.toggle("disk", tier === "disk");
    const bar = el("div", null, { class: "bar", role: "meter", "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": percent.toFixed(1) });
    bar.append(fill);
    row.append(head, bar);
    return row;
  });
  if (!rows.length) rows.push(el("p", "No mounted segments.", { class: "muted" }));
  $("segments").replaceChildren(...rows);
  // Bytes per tier (a master without tiers answers totals only).
  const tiers = answer.tiers || { memory: { segments: 1, used_bytes: answer.total_used_bytes, capacity_bytes: answer.total_capacity_bytes } };
  const perTier = Object.entries(tiers).filter(([, t]) => t.segments).map(([name, t]) => ` · ${name} ${formatBytes(t.used_bytes)} / ${formatBytes(t.capacity_bytes)}`);
  $("segments-count").textContent = `${answer.total_segments}${perTier.join("")}`;
}

// ---- sessions table ---------------------------------------------------------------------------
// Rows are kept per session id and updated in place, so a poll never replaces the button a
// person (or a test) is about to click.
const rowsById = new Map();

function makeRow(sessionId) {
  const row = el("tr", null, { "data-testid": "session-row" });
  row.dataset.sessionId = sessionId;
  const release = el("button", "Release", { type: "button", class: "danger", "data-testid": "release-button" });
  release.addEventListener("click", () => releaseSession(row.dataset.sessionId));
  const actions = el("td");
  actions.append(release);
  row.append(
    el("td", sessionId, { class: "session-id" }),
    el("td"),
    el("td", null, { class: "num" }),
    el("td", null, { class: "num", "data-testid": "cell-bytes" }),
    el("td", null, { class: "num", "data-testid": "cell-exclusive" }),
    el("td", null, { class: "num", "data-testid": "cell-idle" }),
    actions,
  );
  return row;
}

function updateRow(row, session) {
  const [, pinned, pages, bytes, exclusive, idle] = row.children;
  pinned.textContent = session.pinned ? "pinned" : "–";
  pinned.className = session.pinned ? "pin" : "muted";
  pages.textContent = Number(session.pages_cached).toLocaleString("en-US");
  setBytes(bytes, session.pages_bytes);
  setBytes(exclusive, session.exclusive_bytes);
  idle.textContent = formatIdle(session.idle_ms);
  idle.title = `${session.idle_ms} ms since its last token`;
  // The raw figures, for scripts and tests that read the table (dataset values become strings).
  Object.assign(row.dataset, { pinned: session.pinned, bytes: session.pages_bytes, exclusiveBytes: session.exclusive_bytes, idleMs: session.idle_ms });
}

/** The sessions to show: filtered, then sorted by the chosen column (ties by session id). */
function visibleSessions() {
  const shown = state.sessions.filter((s) => state.filter === "all" || s.pinned === (state.filter === "pinned"));
  if (state.sortKey) {
    const key = state.sortKey;
    const sign = state.sortDescending ? -1 : 1;
    shown.sort((a, b) => sign * (a[key] - b[key]) || (a.session_id < b.session_id ? -1 : a.session_id > b.session_id ? 1 : 0));
  }
  return shown;
}

function renderSessions() {
  const shown = visibleSessions();
  const live = new Set(state.sessions.map((s) => s.session_id));
  for (const [id, row] of rowsById) {
    if (!live.has(id)) {
      row.remove();
      rowsById.delete(id);
    }
  }
  const body = $("sessions-body");
  const shownIds = new Set();
  for (const session of shown) {
    let row = rowsById.get(session.session_id);
    if (!row) {
      row = makeRow(session.session_id);
      rowsById.set(session.session_id, row);
    }
    updateRow(row, session);
    body.append(row); // appending an attached node moves it: this puts rows in display order
    shownIds.add(session.session_id);
  }
  for (const [id, row] of rowsById) if (!shownIds.has(id)) row.remove();
  $("sessions-empty").hidden = shown.length > 0;
  const totals = state.sessionTotals;
  if (totals) {
    $("sessions-count").textContent = `${shown.length} shown of ${totals.total_sessions} · ${formatBytes(totals.total_pages_bytes)} cached, ${formatBytes(totals.total_exclusive_bytes)} exclusive`;
  }
  for (const header of document.querySelectorAll("th.sortable")) {
    const active = header.dataset.sort === state.sortKey;
    header.querySelector(".arrow").textContent = active ? (state.sortDescending ? "▼" : "▲") : "";
    if (active) header.setAttribute("aria-sort", state.sortDescending ? "descending" : "ascending");
    else header.removeAttribute("aria-sort");
  }
}

/** First click on a column sorts it largest first (what an operator hunts for); again flips. */
function sortBy(key) {
  if (state.sortKey === key) state.sortDescending = !state.sortDescending;
  else {
    state.sortKey = key;
    state.sortDescending = true;
  }
  renderSessions(); // at once, from what is loaded; the master's ranking follows
  refresh();
}

function setFilter(filter) {
  state.filter = filter;
  for (const button of document.querySelectorAll(".filters .toggle")) {
    const active = button.dataset.filter === filter;
    button.classList.toggle("active", active);
    button.setAttribute("aria-pressed", String(active));
  }
  renderSessions();
  refresh();
}

// ---- confirmation dialog ----------------------------------------------------------------------
/**
 * Shows the in-page confirmation dialog. `options`: title, message (strings and nodes),
 * okLabel, number ({label, value}: a minutes field), check ({label, checked, required}: a
 * required check must be ticked before the action can run). Resolves to {number, checked}
 * when confirmed, null when cancelled.
 */
function confirmAction(options) {
  const dialog = $("confirm-dialog");
  $("confirm-title").textContent = options.title;
  $("confirm-message").replaceChildren(...options.message);
  $("confirm-ok").textContent = options.okLabel;
  $("confirm-error").textContent = "";
  const numberInput = $("confirm-number");
  $("confirm-number-row").hidden = !options.number;
  if (options.number) {
    $("confirm-number-label").textContent = options.number.label;
    numberInput.value = String(options.number.value);
  }
  const check = $("confirm-check");
  $("confirm-check-row").hidden = !options.check;
  if (options.check) {
    $("confirm-check-label").textContent = options.check.label;
    check.checked = Boolean(options.check.checked);
  }
  const gate = () => {
    $("confirm-ok").disabled = Boolean(options.check && options.check.required && !check.checked);
  };
  gate();
  // One dialog serves every action: its listeners live for one question, removed together.
  const listeners = new AbortController();
  const once = { signal: listeners.signal };
  return new Promise((resolve) => {
    const finish = (result) => {
      listeners.abort();
      dialog.close();
      resolve(result);
    };
    const onSubmit = (event) => {
      event.preventDefault();
      const number = Number(numberInput.value);
      if (options.number && !(numberInput.value !== "" && Number.isFinite(number) && number >= 0)) {
        $("confirm-error").textContent = "Enter a number of minutes (0 or more).";
        return;
      }
      finish({ number, checked: check.checked });
    };
    const onCancel = (event) => {
      event.preventDefault();
      finish(null);
    };
    check.addEventListener("change", gate, once);
    $("confirm-form").addEventListener("submit", onSubmit, once);
    $("confirm-cancel").addEventListener("click", onCancel, once);
    dialog.addEventListener("cancel", onCancel, once); // Escape
    dialog.showModal();
  });
}

/** A figure for a dialog message: binary units, the exact count in its title. */
function bytesNode(bytes, testId) {
  const node = el("strong", null, { "data-testid": testId });
  setBytes(node, bytes);
  return node;
}

/** Runs one release call, reports its answer or error in the status line, then refreshes. */
async function runRelease(path, body, describe) {
  try {
    const answer = await api(path, body);
    const [text, freed] = describe(answer);
    const pending = answer.pending_bytes ? `; ${formatBytes(answer.pending_bytes)} more once readers finish` : "";
    const disk = answer.freed_disk_bytes ? `; ${formatBytes(answer.freed_disk_bytes)} freed on disk` : "";
    showStatus(`${text}${pending}${disk}`, "ok", freed);
  } catch (error) {
    if (error instanceof AuthRequired) askForToken();
    else showStatus(`Release failed: ${error.message}`, "error");
  }
  await refresh();
}

async function releaseSession(sessionId) {
  const session = state.sessions.find((s) => s.session_id === sessionId);
  if (!session) return;
  const choice = await confirmAction({
    title: "Release session",
    message: [
      "Release session ",
      el("code", sessionId, { "data-testid": "confirm-session-id" }),
      "? This removes the pages only it holds, ",
      bytesNode(session.exclusive_bytes, "confirm-exclusive-bytes"),
      ` (${exactBytes(session.exclusive_bytes)}; the allocator frees them rounded up to its alignment) of the ${formatBytes(session.pages_bytes)} it caches; pages other sessions share stay cached.`,
    ],
    okLabel: "Release session",
  });
  if (!choice) return;
  await runRelease("/v1/memory/release_session", { session_id: sessionId }, (a) => [
    a.message
      ? `Session ${sessionId}: ${a.message}`
      : `Released session ${sessionId}: freed ${bothBytes(a.freed_bytes)} from ${plural(a.released_pages, "page")}${a.kept_shared ? `, ${plural(a.kept_shared, "shared page")} kept` : ""}`,
    a.freed_bytes,
  ]);
}

async function releaseStale() {
  const choice = await confirmAction({
    title: "Release stale sessions",
    message: ["Release every session idle for at least this many minutes. Their exclusive pages are freed; shared pages stay cached."],
    okLabel: "Release stale",
    number: { label: "Idle for at least (minutes)", value: 30 },
    check: { label: "Include pinned sessions", checked: false, required: false },
  });
  if (!choice) return;
  await runRelease("/v1/memory/release_stale_sessions", { max_idle_minutes: choice.number, include_pinned: choice.checked }, (a) => [
    `Released ${plural(a.sessions_released, "stale session")}: freed ${bothBytes(a.total_bytes_freed)} from ${plural(a.total_pages_freed, "page")}`,
    a.total_bytes_freed,
  ]);
}

async function releaseAll() {
  const totals = state.sessionTotals;
  const choice = await confirmAction({
    title: "Release all sessions",
    message: [
      `Release all ${totals ? totals.total_sessions : ""} sessions, pinned ones included, freeing up to `,
      bytesNode(totals ? totals.total_pages_bytes : 0, "confirm-total-bytes"),
      ". Engines will recompute every conversation's KV cache.",
    ],
    okLabel: "Release all",
    check: { label: "Yes, release every session", checked: false, required: true },
  });
  if (!choice) return;
  await runRelease("/v1/memory/release_all_sessions", { confirm: true }, (a) => [
    `Released all sessions (${a.sessions_released}): freed ${bothBytes(a.bytes_freed)} from ${plural(a.pages_freed, "page")}`,
    a.bytes_freed,
  ]);
}

async function releaseKvCache() {
  const choice = await confirmAction({
    title: "Release KV cache",
    message: ["Remove every KV-cache object of this view, in sessions or not. Objects of other data types stay."],
    okLabel: "Release KV cache",
    check: { label: "Keep pinned sessions' pages", checked: true, required: false },
  });
  if (!choice) return;
  await runRelease("/v1/memory/release_kv_cache", { keep_pinned: choice.checked }, (a) => [
    `Released the KV cache: freed ${bothBytes(a.freed_bytes)} from ${plural(a.released_pages, "page")}${a.kept_pinned ? `, ${plural(a.kept_pinned, "pinned page")} kept` : ""}`,
    a.freed_bytes,
  ]);
}

// ---- token prompt -----------------------------------------------------------------------------
/** A call answered 401: polling stops until a token is entered (a rejected one is dropped). */
function askForToken() {
  if (state.awaitingToken) return;
  state.awaitingToken = true;
  const rejected = window.sessionStorage.getItem(TOKEN_KEY) !== null;
  window.sessionStorage.removeItem(TOKEN_KEY);
  $("token-message").textContent = rejected
    ? "The master did not accept that token. Enter another."
    : "This master needs a token to show its memory.";
  $("token-input").value = "";
  $("token-dialog").showModal();
}

function useToken(event) {
  event.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  // sessionStorage: the token lives as long as this tab, never on disk across restarts.
  window.sessionStorage.setItem(TOKEN_KEY, token);
  state.awaitingToken = false;
  $("token-dialog").close();
  refresh();
}

// ---- polling ----------------------------------------------------------------------------------
/** Reads stats, segments and the sessions, and redraws; one at a time. */
async function refresh() {
  if (state.awaitingToken) return;
  if (state.refreshing) {
    // A release answered while a poll was under way: poll once more right after it, so the
    // table never keeps a row the release removed until the next tick.
    state.refreshAgain = true;
    return;
  }
  state.refreshing = true;
  state.refreshAgain = false;
  window.clearTimeout(state.timer);
  try {
    const [stats, segments, listing] = await Promise.all([
      api("/v1/memory/stats?history=true"),
      api("/v1/memory/segments"),
      loadSessions(),
    ]);
    Object.assign(state, { lastStats: stats, sessions: listing.sessions, sessionTotals: listing.totals });
    renderStats(stats);
    renderChart(occupancySeries(stats));
    renderSegments(segments);
    renderSessions();
    state.refreshes += 1;
    // Tests and scripts wait on this attribute to know a fresh poll has been drawn.
    document.body.dataset.refreshes = String(state.refreshes);
  } catch (error) {
    if (error instanceof AuthRequired) askForToken();
    else showStatus(`Refresh failed: ${error.message}`, "error");
  } finally {
    state.refreshing = false;
    // A timeout after each poll, not an interval: a slow master never gets polls piled up.
    if (!state.awaitingToken) state.timer = window.setTimeout(refresh, state.refreshAgain ? 0 : REFRESH_MS);
  }
}

function start() {
  for (const header of document.querySelectorAll("th.sortable")) {
    // The header holds a button, so the keyboard sorts too (Enter or Space clicks it).
    header.addEventListener("click", () => sortBy(header.dataset.sort));
  }
  for (const button of document.querySelectorAll(".filters .toggle")) {
    button.addEventListener("click", () => setFilter(button.dataset.filter));
  }
  $("release-stale").addEventListener("click", releaseStale);
  $("release-all").addEventListener("click", releaseAll);
  $("release-kv").addEventListener("click", releaseKvCache);
  $("token-form").addEventListener("submit", useToken);
  // The token dialog stays until a token is given: without one the page has nothing to show.
  $("token-dialog").addEventListener("cancel", (event) => event.preventDefault());
  window.addEventListener("resize", () => state.lastStats && renderChart(occupancySeries(state.lastStats)));
  refresh();
}

start();
