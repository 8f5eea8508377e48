// Time-series charts on <canvas>, shared by the live dashboard and the
// `--report FILE.html` of `pagoda bench` / `pagoda sim`. Points are raw
// counters (SERIES_COLUMNS, the order of server/dashboard.h's SeriesPoint);
// rates are derived here so every producer records the same columns.
"use strict";
const SERIES_COLUMNS = ["t", "blocks_used", "blocks_total", "blocks_cached", "running", "waiting",
                        "prefix_queries", "prefix_hits", "preemptions", "generation_tokens", "prompt_tokens"];
const COL = Object.fromEntries(SERIES_COLUMNS.map((c, i) => [c, i]));

// Rates over a trailing window of `win` seconds (a counter's delta / the time delta).
function deriveSeries(points, win) {
  win = win || 2.0;
  const out = {t: [], kv: [], cached: [], hit: [], running: [], waiting: [], preempt: [], gen: [], prompt: []};
  let j = 0;
  for (let i = 0; i < points.length; i++) {
    const p = points[i];
    while (j < i && p[COL.t] - points[j][COL.t] > win) j++;
    const q = points[j === i && i > 0 ? i - 1 : j];
    const dt = p[COL.t] - q[COL.t];
    const total = p[COL.blocks_total] || 1;
    out.t.push(p[COL.t]);
    out.kv.push(100 * p[COL.blocks_used] / total);
    out.cached.push(100 * p[COL.blocks_cached] / total);
    const dq = p[COL.prefix_queries] - q[COL.prefix_queries];
    out.hit.push(dq > 0 ? 100 * (p[COL.prefix_hits] - q[COL.prefix_hits]) / dq
                        : (out.hit.length ? out.hit[out.hit.length - 1] : 0));
    out.running.push(p[COL.running]);
    out.waiting.push(p[COL.waiting]);
    out.preempt.push(p[COL.preemptions]);
    out.gen.push(dt > 0 ? (p[COL.generation_tokens] - q[COL.generation_tokens]) / dt : 0);
    out.prompt.push(dt > 0 ? (p[COL.prompt_tokens] - q[COL.prompt_tokens]) / dt : 0);
  }
  return out;
}

const CHARTS = [
  {id: "kv", title: "KV cache usage", unit: "%", yMax: 100,
   lines: [["kv", "used", "#4cc9f0"], ["cached", "cached", "#7b8cde"]]},
  {id: "hit", title: "Prefix hit rate", unit: "%", yMax: 100, lines: [["hit", "hit tokens", "#80ed99"]]},
  {id: "rw", title: "Requests", unit: "", lines: [["running", "running", "#f4a261"], ["waiting", "waiting", "#e76f51"]]},
  {id: "pre", title: "Preemptions (total)", unit: "", lines: [["preempt", "preemptions", "#ef476f"]]},
  {id: "tps", title: "Tokens / s", unit: "", lines: [["gen", "generated", "#ffd166"], ["prompt", "prompt", "#06d6a0"]]},
];

function niceMax(v) {
  if (!(v > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * e >= v) return m * e;
  return 10 * e;
}

function fmt(v) {
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (Math.abs(v) >= 100) return v.toFixed(0);
  return (Math.round(v * 10) / 10).toString();
}

// Draws one chart: lines = [[values, label, colour]], xs in seconds.
function drawChart(canvas, xs, lines, spec) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const L = 40, R = 8, T = 22, B = 18;
  let ymax = spec.yMax || 0;
  if (!spec.yMax) for (const [vals] of lines) for (const v of vals) ymax = Math.max(ymax, v);
  ymax = spec.yMax || niceMax(ymax * 1.05);
  const x0 = xs.length ? xs[0] : 0, x1 = xs.length ? Math.max(xs[xs.length - 1], x0 + 1) : 1;
  const X = (x) => L + (w - L - R) * (x - x0) / (x1 - x0);
  const Y = (y) => T + (h - T - B) * (1 - Math.min(y, ymax) / ymax);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#c9d1d9";
  g.fillText(spec.title, L, 13);
  g.strokeStyle = "#30363d";
  g.fillStyle = "#8b949e";
  g.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const y = Y(ymax * k / 4);
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.fillText(fmt(ymax * k / 4) + spec.unit, 2, y + 4);
  }
  g.fillText(fmt(x0) + " s", L, h - 4);
  const right = fmt(x1) + " s";
  g.fillText(right, w - R - g.measureText(right).width, h - 4);
  let lx = L + g.measureText(spec.title).width + 14;
  for (const [vals, label, colour] of lines) {
    g.strokeStyle = colour;
    g.lineWidth = 1.6;
    g.beginPath();
    for (let i = 0; i < vals.length; i++) {
      const px = X(xs[i]), py = Y(vals[i]);
      if (i === 0) g.moveTo(px, py); else g.lineTo(px, py);
    }
    g.stroke();
    g.fillStyle = colour;
    g.fillRect(lx, 6, 8, 8);
    g.fillStyle = "#8b949e";
    const last = vals.length ? " " + fmt(vals[vals.length - 1]) + spec.unit : "";
    g.fillText(label + last, lx + 11, 13);
    lx += g.measureText(label + last).width + 24;
  }
}

// Creates (once) one canvas per chart inside `root` and draws `points`.
function drawAllCharts(root, points) {
  const d = deriveSeries(points);
  for (const spec of CHARTS) {
    let c = root.querySelector("canvas[data-chart='" + spec.id + "']");
    if (!c) {
      c = document.createElement("canvas");
      c.dataset.chart = spec.id;
      c.className = "chart";
      root.appendChild(c);
    }
    drawChart(c, d.t, spec.lines.map(([key, label, colour]) => [d[key], label, colour]), spec);
  }
  return d;
}
