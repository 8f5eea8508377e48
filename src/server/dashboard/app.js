// The live dashboard: one EventSource on /dashboard/events, each `snapshot`
// event redraws the block grid (canvas, one cell per block), the prefix tree
// (SVG), the request table and the charts (plots.js). The API key, when the
// server has one, comes from this page's ?key= (EventSource cannot send an
// Authorization header). window.pagodaDashboard is the state tests read.
"use strict";
const params = new URLSearchParams(location.search);
const KEY = params.get("key");
const HZ = params.get("hz") || "4";
const withKey = (url) => KEY ? url + (url.includes("?") ? "&" : "?") + "key=" + encodeURIComponent(KEY) : url;

const GRID_FREE = 0, GRID_CACHED = 1, GRID_TIER = 2, GRID_NULL = 3, GRID_SHARED = 4, GRID_UNKNOWN = 5, GRID_REQ0 = 6;
const FIXED = {[GRID_FREE]: [33, 38, 45], [GRID_CACHED]: [123, 140, 222], [GRID_TIER]: [201, 160, 220],
               [GRID_NULL]: [0, 0, 0], [GRID_SHARED]: [255, 209, 102], [GRID_UNKNOWN]: [139, 148, 158]};
// Request k's colour: hues spread by the golden angle, none near the fixed ones.
function requestRgb(k) {
  const h = (k * 137.508 + 150) % 360, s = 0.65, l = 0.55;
  const f = (n) => { const a = (n + h / 30) % 12; return l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(a - 3, 9 - a, 1)); };
  return [Math.round(255 * f(0)), Math.round(255 * f(8)), Math.round(255 * f(4))];
}
const rgbOf = (code) => FIXED[code] || requestRgb(code - GRID_REQ0);
const css = (rgb) => "rgb(" + rgb.join(",") + ")";

const state = {snapshot: null, numCells: 0, cells: null, series: [], updates: 0, requests: [], prefixNodes: [],
               owners: new Map(), layout: null};
window.pagodaDashboard = state;
const $ = (id) => document.getElementById(id);
const tip = $("tip");

function decodeGrid(b64) {
  const bin = atob(b64), out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// ---- block grid ---------------------------------------------------------------
// cells[c] is block c + 1: the null block 0 is never handed out, so the grid
// shows the usable blocks (pagoda:kv_cache_blocks_total of them).
function drawGrid(cells) {
  const c = $("grid");
  const w = c.clientWidth, h = c.clientHeight, n = cells.length;
  // The largest square cell that fits n cells in w x h (at 100k blocks: 1-2 px).
  let size = Math.max(1, Math.floor(Math.sqrt((w * h) / n)));
  while (size > 1 && Math.floor(w / size) * Math.floor(h / size) < n) size--;
  const cols = Math.max(1, Math.floor(w / size));
  const rows = Math.ceil(n / cols);
  c.width = cols * size;
  c.height = Math.max(rows * size, 1);
  c.style.height = Math.min(h, c.height) + "px";
  const g = c.getContext("2d");
  const img = g.createImageData(c.width, c.height);
  const gap = size >= 4 ? 1 : 0;
  for (let b = 0; b < n; b++) {
    const [r, gg, bl] = rgbOf(cells[b]);
    const x0 = (b % cols) * size, y0 = Math.floor(b / cols) * size;
    for (let y = y0; y < y0 + size - gap; y++) {
      let o = (y * c.width + x0) * 4;
      for (let x = 0; x < size - gap; x++, o += 4) { img.data[o] = r; img.data[o + 1] = gg; img.data[o + 2] = bl; img.data[o + 3] = 255; }
    }
  }
  g.putImageData(img, 0, 0);
  c.dataset.cells = String(n);
  state.layout = {size, cols, n};
}

function gridLegend(s) {
  const counts = {};
  for (const code of state.cells) {
    const k = code >= GRID_REQ0 ? "req" : code;
    counts[k] = (counts[k] || 0) + 1;
  }
  const item = (rgb, label, k) => '<span><i style="background:' + css(rgb) + '"></i>' + label + " " + (counts[k] || 0) + "</span>";
  $("grid-legend").innerHTML = item(FIXED[GRID_FREE], "free", GRID_FREE) + item(FIXED[GRID_CACHED], "cached-evictable", GRID_CACHED) +
    item(requestRgb(0), "used (colour = request)", "req") + item(FIXED[GRID_SHARED], "shared", GRID_SHARED) +
    item(FIXED[GRID_TIER], "lower tier", GRID_TIER) + item(FIXED[GRID_UNKNOWN], "used, not listed or another tenant's", GRID_UNKNOWN);
}

$("grid").addEventListener("mousemove", (e) => {
  const L = state.layout;
  if (!L || !state.cells) return;
  const r = e.target.getBoundingClientRect();
  const c = Math.floor((e.clientY - r.top) / L.size) * L.cols + Math.floor((e.clientX - r.left) / L.size);
  if (c < 0 || c >= L.n || e.clientX - r.left >= L.cols * L.size) return hideTip();
  const code = state.cells[c], b = c + 1;
  const names = {[GRID_FREE]: "free", [GRID_CACHED]: "cached-evictable", [GRID_TIER]: "lower tier",
                 [GRID_NULL]: "null block", [GRID_SHARED]: "shared", [GRID_UNKNOWN]: "used (not listed, or another tenant's)"};
  const owners = state.owners.get(b) || [];
  showTip(e, "block " + b + ": " + (names[code] || "used") +
          (owners.length ? "\nheld by " + owners.join(", ") : ""));
});
$("grid").addEventListener("mouseleave", () => hideTip());

function showTip(e, text, html) {
  tip.style.display = "block";
  if (html) tip.innerHTML = html; else tip.textContent = text;
  tip.style.left = Math.min(e.clientX + 14, window.innerWidth - 440) + "px";
  tip.style.top = (e.clientY + 14) + "px";
}
function hideTip() { tip.style.display = "none"; }

// ---- prefix tree --------------------------------------------------------------
const blockText = new Map();  // block -> {hits, text} fetched on hover
let treeDrawn = "";  // what the SVG shows now: redrawn only when it changes (keeps hovers steady)
function drawTree(s, force) {
  const svg = $("tree");
  const key = JSON.stringify(s.prefix) + svg.clientWidth + "x" + svg.clientHeight;
  if (key === treeDrawn && !force) return;
  treeDrawn = key;
  const nodes = s.prefix.nodes.map(([block, parent, hits, depth, inUse, pinTtl]) => ({block, parent, hits, depth, inUse, pinTtl: pinTtl || 0, kids: []}));
  state.prefixNodes = nodes;
  const byBlock = new Map(nodes.map((n) => [n.block, n]));
  const roots = [];
  for (const n of nodes) (n.parent >= 0 && byBlock.has(n.parent) ? byBlock.get(n.parent).kids : roots).push(n);
  // Leaves get consecutive rows (most hit subtrees first); a parent sits at its children's mean.
  let row = 0, maxDepth = 0;
  const place = (n) => {
    maxDepth = Math.max(maxDepth, n.depth);
    n.kids.sort((a, b) => b.hits - a.hits || a.block - b.block);
    if (!n.kids.length) { n.y = row++; return; }
    n.kids.forEach(place);
    n.y = n.kids.reduce((a, k) => a + k.y, 0) / n.kids.length;
  };
  roots.sort((a, b) => b.hits - a.hits || a.block - b.block).forEach(place);
  const w = svg.clientWidth || 400, h = svg.clientHeight || 300;
  const maxHits = Math.max(1, ...nodes.map((n) => n.hits));
  const X = (d) => 16 + (w - 40) * (maxDepth ? d / maxDepth : 0);
  const Y = (y) => 14 + (h - 28) * (row > 1 ? y / (row - 1) : 0.5);
  const R = (hits) => 2.5 + 9 * Math.sqrt(hits / maxHits);
  let out = "";
  for (const n of nodes) {
    if (n.parent >= 0 && byBlock.has(n.parent)) {
      const p = byBlock.get(n.parent);
      out += '<line x1="' + X(p.depth) + '" y1="' + Y(p.y) + '" x2="' + X(n.depth) + '" y2="' + Y(n.y) + '"/>';
    }
  }
  for (const n of nodes) {
    out += '<circle data-block="' + n.block + '" data-hits="' + n.hits + '" cx="' + X(n.depth) + '" cy="' + Y(n.y) +
           '" r="' + R(n.hits) + '" fill="' + (n.inUse ? "#4cc9f0" : "#7b8cde") + '"' +
           (n.pinTtl > 0 ? ' stroke="#f9c74f" stroke-width="2.5"><title>block ' + n.block + ": pinned, " + Math.round(n.pinTtl) + " s left</title></circle>" : "/>");
    if (n.hits === maxHits && n.hits > 0) out += '<text x="' + (X(n.depth) + R(n.hits) + 3) + '" y="' + (Y(n.y) - 6) + '">' + n.hits + "</text>";
  }
  svg.innerHTML = nodes.length ? out : '<text x="12" y="24">no cached prefix yet</text>';
  $("tree-info").textContent = nodes.length + " of " + s.prefix.cached_blocks + " cached blocks (most hit first)";
}

$("tree").addEventListener("mousemove", (e) => {
  const t = e.target;
  if (t.tagName !== "circle") return hideTip();
  const block = Number(t.dataset.block), hits = Number(t.dataset.hits);
  const head = "block " + block + " · " + hits + " hit" + (hits === 1 ? "" : "s");
  const known = blockText.get(block);
  if (known) return showTip(e, head + "\n" + known);
  showTip(e, head + "\n…");
  blockText.set(block, "…");
  fetch(withKey("/dashboard/block?id=" + block)).then((r) => r.ok ? r.json() : null).then((j) => {
    blockText.set(block, j ? JSON.stringify(j.text) : "(evicted)");
    if (tip.style.display === "block" && tip.textContent.startsWith("block " + block + " "))
      tip.textContent = head + "\n" + blockText.get(block);
  }).catch(() => blockText.delete(block));
});
$("tree").addEventListener("mouseleave", () => hideTip());

// ---- requests -----------------------------------------------------------------
function tableText(tables) {
  if (!tables.length) return "";
  return tables.map((t, g) => {
    const ids = t.slice(0, 24).join(" ") + (t.length > 24 ? " … (+" + (t.length - 24) + ")" : "");
    return (tables.length > 1 ? "g" + g + ": " : "") + "[" + ids + "]";
  }).join("\n");
}

function drawRequests(s) {
  state.requests = s.requests;
  const esc = (x) => String(x).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  const rows = s.requests.map((r) => {
    const name = (r.tag || "#" + r.id) + (r.index ? " /" + r.index : "");
    const sw = r.tables.length ? '<i class="sw" style="background:' + css(rgbOf(r.colour)) + '"></i>' : '<i class="sw"></i>';
    return '<tr data-id="' + r.id + '" data-tag="' + esc(r.tag) + '" data-state="' + r.state + '">' +
      "<td>" + sw + esc(name) + '</td><td class="st-' + r.state + '">' + r.state + "</td><td>" + esc(r.why) +
      "</td><td>" + r.prompt + "</td><td>" + r.output + "</td><td>" + r.computed + "</td><td>" +
      (r.cached < 0 ? "-" : r.cached) + "</td><td>" + r.preemptions + '</td><td class="blocks">' + esc(tableText(r.tables)) +
      "</td><td>" + esc(r.miss || "-") + "</td></tr>";
  });
  document.querySelector("#requests tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="10" style="color:#8b949e">no request running or waiting</td></tr>';
  const listed = s.requests.length, all = s.num_running + s.num_waiting;
  $("req-info").textContent = s.num_running + " running, " + s.num_waiting + " waiting" + (listed < all ? " (" + listed + " listed)" : "");
}

// ---- updates ------------------------------------------------------------------
function update(s) {
  const t0 = performance.now();
  state.snapshot = s;
  state.updates++;
  for (const p of s.series) state.series.push(p);
  if (state.series.length > 4800) state.series.splice(0, state.series.length - 4800);
  state.cells = decodeGrid(s.grid).subarray(1);
  state.numCells = state.cells.length;
  state.owners = new Map();
  for (const r of s.requests) {
    const name = (r.tag || "#" + r.id) + (r.index ? "/" + r.index : "");
    for (const t of r.tables) for (const b of t) {
      if (b === 0) continue;
      const o = state.owners.get(b);
      if (o) { if (!o.includes(name)) o.push(name); } else state.owners.set(b, [name]);
    }
  }
  drawGrid(state.cells);
  gridLegend(s);
  drawTree(s);
  drawRequests(s);
  const d = drawAllCharts($("charts"), state.series);
  const c = s.counters, last = (a) => a.length ? a[a.length - 1] : 0;
  $("t-blocks").textContent = (s.num_blocks - 1) + " × " + s.block_size;
  $("t-used").textContent = c.blocks_used + " (" + (100 * c.blocks_used / Math.max(1, c.blocks_total)).toFixed(1) + "%)";
  $("t-cached").textContent = c.blocks_cached;
  $("t-rw").textContent = s.num_running + " / " + s.num_waiting;
  $("t-hit").textContent = c.prefix_queries ? (100 * c.prefix_hits / c.prefix_queries).toFixed(1) + "%" : "-";
  $("t-pre").textContent = c.preemptions;
  $("t-tps").textContent = fmt(last(d.gen));
  $("grid-info").textContent = (s.num_blocks - 1) + " blocks of " + s.block_size + " tokens" +
    (s.num_groups > 1 ? ", " + s.num_groups + " KV groups" : "");
  state.lastUpdateMs = performance.now() - t0;  // decode + redraw of one event (tests read it)
}

function connect() {
  const es = new EventSource(withKey("/dashboard/events?hz=" + encodeURIComponent(HZ)));
  es.addEventListener("snapshot", (e) => {
    $("status").className = "live";
    const s = JSON.parse(e.data);
    $("status").textContent = "live · " + HZ + " Hz" +
      (s.snapshot_us !== undefined ? " · snapshot " + (s.snapshot_us / 1000).toFixed(2) + " ms" : "");
    update(s);
  });
  es.onerror = () => { $("status").className = "down"; $("status").textContent = "disconnected, retrying"; };
  state.source = es;
}
window.addEventListener("resize", () => { if (state.snapshot) { drawGrid(state.cells); drawTree(state.snapshot, true); drawAllCharts($("charts"), state.series); } });
connect();
