// View 9: one layout (typed here, or opened from an address #layout?model=...&gpus=...&tp=...): its per-stage memory
// bars, step time and MFU with their band, time and cost to train, and three drawings of GET /api/estimate's
// `timeline` (meshplan estimate --timeline): the step stage by stage, the memory over the step, the placement.

import { conditionFlags, conditionParams } from "./conditions.js";
import * as state from "./state.js";
import { cliCommand, cliModel } from "./takeaway.js";
import {
  $, PIECE_COLORS, TERM_COLORS, chartWidth, el, fmtBytes, fmtInt, fmtPct, fmtSeconds, formValues, inkOn, isAbort, latestOnly,
  onFormChange, onResize, readConfig, showError, svg, ticks, tracked,
} from "./util.js";

const call = latestOnly();
const LABELS = { seq: "Sequence length", micro_batch: "Micro-batch", gpus: "GPUs", global_batch: "Global batch",
  tp: "TP", pp: "PP", vpp: "Virtual stages", cp: "CP", ep: "EP", zero: "ZeRO", dp_shard: "ZeRO shard group",
  tokens: "Tokens to train", price_per_gpu_hour: "Price per GPU-hour" };
export const KIND_COLORS = {
  forward: "#4e79a7", backward: "#f28e2b", bubble: "#e3e6ea", optimizer: "#edc948", host: "#bab0ac",
  tp: "#c8383b", cp: "#b07aa1", ep: "#59a14f", pp: "#17a2b8", dp: "#9c755f",
};
const KIND_NAMES = { forward: "forward", backward: "backward", bubble: "bubble (idle)", optimizer: "optimizer step",
  host: "host", tp: "TP/SP traffic", cp: "CP traffic", ep: "EP traffic", pp: "pipeline sends and syncs", dp: "DP/ZeRO traffic" };
const BAR_TERMS = ["weights_bytes", "adapter_weights_bytes", "gradients_bytes", "master_weights_bytes", "optimizer_moments_bytes",
  "activations_bytes", "logits_bytes"];
const MAX_ROWS = 64;
let last = null;

let unset = {};

export function init(context) {
  // what estimate takes for the layout fields nothing sets (the schema's defaults; null: derived, sent empty)
  unset = Object.fromEntries(Object.entries(context.catalog.unset).map(([k, v]) => [k, v === null ? "" : v === false ? "0" : v]));
  onFormChange($("#ly-form"), update);
  $("#ly-config").addEventListener("change", openConfig);
  onResize(() => last && draw(last));
  update();
}

// The address's inputs this form does not show (a recipe's kernels, axis order or a condition of its own), passed
// on as they are: the page's "axis" is the placement picture's choice, not an input.
function carried() {
  const { axis, ...rest } = state.extrasOf("layout");
  return rest;
}

export function params(v) {
  return {
    ...carried(),
    model: v.model, gpu: v.gpu, gpus: v.gpus, tp: v.tp, pp: v.pp, vpp: v.vpp, cp: v.cp, ep: v.ep, zero: v.zero,
    sp: v.sp ? "true" : null, micro_batch: v.micro_batch, seq: v.seq, recompute: v.recompute, schedule: v.schedule || null,
    dp_shard: v.dp_shard || null, global_batch: v.global_batch || null, tokens: v.tokens || null,
    price_per_gpu_hour: v.price_per_gpu_hour || null, precision: v.precision || null, attention: v.attention || null,
    cp_kind: v.cp_kind, expert_tp: v.expert_tp || null, ...conditionParams(v), timeline: "true",
  };
}

// The address of the layout page for a layout (the same names as /api/estimate's query): what a planner row, a
// recipe or another view links to. Every layout field is written, so the page's own defaults never fill in.
export function layoutHref(q) {
  const out = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v === null || v === undefined || v === "" || k === "timeline") continue;
    out.set(k, v === true ? "1" : v === false ? "0" : String(v));
  }
  return `#layout?${out}`;
}

// An engine's config read by POST /api/config (as --from reads it): its values become this page's address, the GPU
// kind and whatever the file does not set staying as the form has them; what it did not read is counted below.
async function openConfig(event) {
  const file = event.target.files[0];
  if (!file) return;
  try {
    const body = await readConfig(file);
    if (!body.training) throw new Error(`${file.name} is a ${body.kind} serving launcher: this page plans training`);
    const v = formValues($("#ly-form"));
    // what the file leaves unset is the engine's default (estimate's), not this page's example layout
    const shown = new Set(Array.from($("#ly-form").elements, (e) => e.name));
    const reset = Object.fromEntries(Object.entries(unset).filter(([k]) => shown.has(k)));
    const q = { ...reset, model: v.model, gpu: v.gpu, gpus: v.gpus, ...body.query };
    const note = $("#ly-config-note");
    note.hidden = false;
    note.textContent = `Read ${file.name} (${body.kind}): ${fmtInt(body.values.length)} values set the layout; `
      + `${fmtInt(body.not_read.length)} keys not read (meshplan estimate --from ${file.name} lists them).`;
    showError($("#ly-error"), null);
    location.hash = `#layout?${new URLSearchParams(Object.entries(q).map(([k, x]) => [k, String(x)]))}`;
  } catch (err) {
    showError($("#ly-error"), err);
  } finally {
    event.target.value = "";
  }
}

async function update() {
  const v = formValues($("#ly-form"));
  try {
    const r = await tracked($("#ly-results"), () => call("/api/estimate", params(v)));
    showError($("#ly-error"), null);
    last = r;
    draw(r);
    command(v);
  } catch (err) {
    if (!isAbort(err)) showError($("#ly-error"), err, LABELS);
  }
}

function command(v) {
  const flags = [["gpu", v.gpu], ["gpus", v.gpus], ["tp", v.tp, 1], ["pp", v.pp, 1], ["vpp", v.vpp, 1], ["cp", v.cp, 1],
    ["ep", v.ep, 1], ["zero", v.zero, 0], ["sp", v.sp], ["recompute", v.recompute, "none"], ["micro_batch", v.micro_batch, 1],
    ["seq", v.seq, 4096], ["schedule", v.schedule], ["dp_shard", v.dp_shard], ["global_batch", v.global_batch],
    ["precision", v.precision], ["attention", v.attention], ["cp_kind", v.cp_kind, "ring"], ["expert_tp", v.expert_tp],
    ...conditionFlags(v), ...Object.entries(carried()), ["tokens", v.tokens], ["price_per_gpu_hour", v.price_per_gpu_hour],
    ["timeline", true]];
  $("#ly-command").textContent = cliCommand("estimate", [cliModel(v.model)], flags);
}

// A row's seconds by kind from its drawn stretches: what the page shows is what it draws.
export function rowTotals(intervals) {
  const t = { step: 0, exposed: 0, compute: 0, bubble: 0 };
  for (const i of intervals) {
    const d = i.end_s - i.start_s;
    t.step = Math.max(t.step, i.end_s);
    if (i.kind === "forward" || i.kind === "backward") t.compute += d;
    else if (i.kind === "bubble") t.bubble += d;
    else if (i.kind === "comm" && i.exposed) t.exposed += d;
  }
  return t;
}

const money = (x) => (x >= 100 ? fmtInt(x) : x.toPrecision(3));
// A token count as the CLI prints it: 15T, 2.5B, 300M.
function tokensText(n) {
  for (const [div, unit] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "K"]]) {
    if (n >= div) return `${Number((n / div).toPrecision(3))}${unit}`;
  }
  return fmtInt(n);
}

function draw(r) {
  const band = `${fmtSeconds(r.step_time_s_p10)} – ${fmtSeconds(r.step_time_s_p90)}`;
  const mfuBand = `${fmtPct((r.mfu * r.step_time_s) / r.step_time_s_p90)} – ${fmtPct((r.mfu * r.step_time_s) / r.step_time_s_p10)}`;
  const h = $("#ly-headline");
  h.replaceChildren(
    `${r.model} on ${fmtInt(r.gpus)} × ${r.gpu}: step `, el("strong", { id: "ly-step", "data-seconds": r.step_time_s, text: fmtSeconds(r.step_time_s) }),
    ` (P10–P90 ${band}), MFU `, el("strong", { id: "ly-mfu", "data-mfu": r.mfu, text: fmtPct(r.mfu) }), ` (${mfuBand}), `,
    `${fmtInt(r.tokens_per_s_per_gpu)} tokens/s per GPU; heaviest stage ${fmtBytes(r.per_gpu.total_bytes)} of ${fmtBytes(r.hbm_bytes_per_gpu)} `,
    el("span", { class: r.fits ? "ok" : "bad", text: r.fits ? "(fits)" : "(does NOT fit)" }),
  );
  h.title = r.uncertainty;
  drawCost(r);
  drawBars(r);
  drawGantt(r);
  drawMemoryLine(r);
  drawPlacement(r);
}

function drawCost(r) {
  const node = $("#ly-cost");
  const parts = [];
  const t = r.time_to_train;
  if (t) parts.push(el("span", { id: "ly-train", "data-days": t.wall_time_days, "data-gpu-hours": t.gpu_hours_total,
    text: `${tokensText(t.tokens_total)} tokens: ${t.wall_time_days.toFixed(1)} days, ${fmtInt(t.gpu_hours_total)} GPU-hours. ` }));
  if (r.cost) {
    const c = r.cost;
    parts.push(el("span", { id: "ly-money", "data-per-million": c.cost_per_million_tokens, "data-total": c.cost_total ?? "",
      text: `At ${c.price_per_gpu_hour} per GPU-hour: ${money(c.cost_per_million_tokens)} per million tokens`
        + (c.cost_total !== undefined ? `, ${money(c.cost_total)} in all.` : ".") }));
  }
  if (!t) parts.push("Give the tokens to train for the days and GPU-hours. ");
  if (!r.cost) parts.push("Give a price per GPU-hour for the money (none is assumed).");
  node.replaceChildren(...parts);
}

function drawBars(r) {
  const node = $("#ly-bars");
  const w = chartWidth(node);
  const left = 70, right = 12, barH = 26, gap = 10, top = 8;
  const n = r.stages.length;
  const height = top + n * (barH + gap) + 30;
  const max = Math.max(r.hbm_bytes_per_gpu, ...r.stages.map((s) => s.total_bytes)) * 1.04;
  const x = (b) => left + ((w - left - right) * b) / max;
  const root = svg("svg", { viewBox: `0 0 ${w} ${height}`, role: "img", "aria-label": "memory per GPU of each pipeline stage" });
  for (const t of ticks(max / 1e9, 5)) {
    root.append(svg("line", { class: "grid", x1: x(t * 1e9), x2: x(t * 1e9), y1: top, y2: height - 22 }),
      svg("text", { class: "tick", x: x(t * 1e9), y: height - 8, "text-anchor": "middle", text: `${t} GB` }));
  }
  r.stages.forEach((s, i) => {
    const y = top + i * (barH + gap);
    const g = svg("g", { class: "ly-bar", "data-stage": i, "data-bytes": s.total_bytes, tabindex: 0, role: "img",
      "aria-label": `stage ${i}: ${fmtBytes(s.total_bytes)} per GPU` });
    let at = 0;
    for (const term of [...BAR_TERMS, "other"]) {
      const b = term === "other" ? s.total_bytes - BAR_TERMS.reduce((a, k) => a + (s[k] || 0), 0) : s[term] || 0;
      if (b <= 0) continue;
      g.append(svg("rect", { x: x(at), y, width: Math.max(x(at + b) - x(at), 0.5), height: barH,
        fill: TERM_COLORS[term] || "#9c755f" }, svg("title", { text: `${term.replace(/_bytes$/, "").replaceAll("_", " ")}: ${fmtBytes(b)}` })));
      at += b;
    }
    root.append(svg("text", { class: "tick", x: left - 6, y: y + barH / 2 + 4, "text-anchor": "end", text: `stage ${i}` }), g,
      svg("text", { class: "tick", x: Math.min(x(at) + 4, w - 60), y: y + barH / 2 + 4, text: fmtBytes(s.total_bytes) }));
  });
  root.append(svg("line", { class: "hbm-line", x1: x(r.hbm_bytes_per_gpu), x2: x(r.hbm_bytes_per_gpu), y1: top, y2: height - 22 }));
  node.replaceChildren(root);
}

function color(i) {
  return KIND_COLORS[i.kind === "comm" ? i.axis : i.kind];
}

function describe(row, i) {
  const what = i.kind === "comm" ? `${KIND_NAMES[i.axis]}, ${i.exposed ? "exposed" : "hidden behind compute"}` : KIND_NAMES[i.kind];
  const mb = i.micro_batch !== null ? ` of micro-batch ${i.micro_batch}${i.chunk ? `, chunk ${i.chunk}` : ""}` : "";
  const folded = i.count > 1 ? ` (${fmtInt(i.count)} chunks folded)` : "";
  return `stage ${row}: ${what}${mb}${folded}${i.what && i.kind !== "forward" && i.kind !== "backward" ? ` (${i.what})` : ""}: `
    + `${fmtSeconds(i.end_s - i.start_s)}, from ${fmtSeconds(i.start_s)} to ${fmtSeconds(i.end_s)}`;
}

function drawGantt(r) {
  const tl = r.timeline;
  const rows = tl.stages.slice(0, MAX_ROWS);
  const sums = rows.map((row) => rowTotals(row.intervals));
  const step = sums[0].step;
  const totals = $("#ly-totals");
  totals.dataset.stepS = String(step);
  totals.dataset.exposedS = String(sums[0].exposed);
  totals.dataset.rowsAgree = String(sums.every((s) => Math.abs(s.step - step) <= 1e-9 * step
    && Math.abs(s.exposed - sums[0].exposed) <= 1e-9 * step));
  totals.textContent = `Each stage's row ends at ${fmtSeconds(step)} and holds ${fmtSeconds(sums[0].compute)} of compute, `
    + `${fmtSeconds(sums[0].bubble)} of bubble and ${fmtSeconds(sums[0].exposed)} of exposed communication `
    + `(${tl.schedule}, ${fmtInt(tl.micro_batches)} micro-batches${tl.vpp > 1 ? `, ${tl.vpp} chunks a stage` : ""}; drawn in ${tl.drawn_as}).`
    + (tl.stages.length > MAX_ROWS ? ` The first ${MAX_ROWS} of ${tl.stages.length} stages are drawn.` : "");
  const used = new Set(rows.flatMap((row) => row.intervals.map((i) => (i.kind === "comm" ? i.axis : i.kind))));
  $("#ly-gantt-legend").replaceChildren(el("div", { class: "legend-row" }, ...Object.keys(KIND_COLORS).filter((k) => used.has(k))
    .map((k) => el("span", {}, el("i", { class: "swatch", style: `background:${KIND_COLORS[k]}` }), KIND_NAMES[k]))));
  const node = $("#ly-gantt");
  const w = Math.max(chartWidth(node, 1000), 620);
  const left = 62, right = 10, rowH = 22, gap = 8, top = 6;
  const height = top + rows.length * (rowH + gap) + 28;
  const x = (t) => left + ((w - left - right) * t) / step;
  const root = svg("svg", { viewBox: `0 0 ${w} ${height}`, class: "ly-wide", role: "group",
    "aria-label": `step timeline: ${rows.length} stages over ${fmtSeconds(step)}; Tab to a stage, arrow keys to move` });
  for (const t of ticks(step * 1e3, 6)) {
    root.append(svg("line", { class: "grid", x1: x(t / 1e3), x2: x(t / 1e3), y1: top, y2: height - 22 }),
      svg("text", { class: "tick", x: x(t / 1e3), y: height - 8, "text-anchor": "middle", text: `${t} ms` }));
  }
  rows.forEach((row, k) => {
    const y = top + k * (rowH + gap);
    root.append(svg("text", { class: "tick", x: left - 6, y: y + rowH / 2 + 4, "text-anchor": "end", text: `stage ${row.stage}` }));
    const g = svg("g", { role: "list", "aria-label": `stage ${row.stage}` });
    row.intervals.forEach((i, n) => {
      const label = describe(row.stage, i);
      g.append(svg("rect", { class: "ly-iv", x: x(i.start_s), y, width: Math.max(x(i.end_s) - x(i.start_s), 0.3), height: rowH,
        fill: color(i), tabindex: n === 0 ? 0 : -1, role: "listitem", "aria-label": label, "data-row": k, "data-n": n,
        "data-kind": i.kind, "data-axis": i.axis ?? "", "data-s": i.end_s - i.start_s }, svg("title", { text: label })));
    });
    for (const i of row.hidden) {
      g.append(svg("rect", { x: x(i.start_s), y: y + rowH + 1, width: Math.max(x(i.end_s) - x(i.start_s), 0.3), height: 3,
        fill: color(i), opacity: 0.7 }, svg("title", { text: describe(row.stage, i) })));
    }
    root.append(g);
  });
  root.addEventListener("focusin", (e) => show(e.target));
  root.addEventListener("mouseover", (e) => show(e.target));
  root.addEventListener("click", (e) => show(e.target));
  root.addEventListener("keydown", (e) => move(root, e));
  node.replaceChildren(root);
}

function show(target) {
  if (!target.classList || !target.classList.contains("ly-iv")) return;
  $("#ly-detail").replaceChildren(el("p", { text: target.getAttribute("aria-label") }));
}

// Arrow keys move along a stage (left, right) and between stages (up, down, to the stretch at the same time).
function move(root, e) {
  const at = e.target;
  if (!at.classList.contains("ly-iv")) return;
  const row = Number(at.dataset.row), n = Number(at.dataset.n);
  let next = null;
  if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
    next = root.querySelector(`.ly-iv[data-row="${row}"][data-n="${n + (e.key === "ArrowRight" ? 1 : -1)}"]`);
  } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
    const mid = Number(at.getAttribute("x")) + Number(at.getAttribute("width")) / 2;
    const others = Array.from(root.querySelectorAll(`.ly-iv[data-row="${row + (e.key === "ArrowDown" ? 1 : -1)}"]`));
    next = others.find((o) => Number(o.getAttribute("x")) + Number(o.getAttribute("width")) >= mid) || others[others.length - 1];
  } else return;
  e.preventDefault();
  if (!next) return;
  at.setAttribute("tabindex", "-1");
  next.setAttribute("tabindex", "0");
  next.focus();
}

function drawMemoryLine(r) {
  const tl = r.timeline;
  const mem = tl.memory.slice(0, MAX_ROWS);
  const node = $("#ly-memline");
  const w = chartWidth(node, 1000);
  const left = 64, right = 12, top = 10, plotH = 200;
  const height = top + plotH + 50;
  const step = tl.totals.step_time_s;
  const max = Math.max(r.hbm_bytes_per_gpu, ...mem.map((m) => m.peak_bytes)) * 1.05;
  const x = (t) => left + ((w - left - right) * t) / step;
  const y = (b) => top + plotH - (plotH * b) / max;
  const root = svg("svg", { viewBox: `0 0 ${w} ${height}`, role: "img",
    "aria-label": `memory per GPU over the step, one line per stage; peaks ${mem.map((m) => fmtBytes(m.peak_bytes)).join(", ")}` });
  for (const t of ticks(max / 1e9, 5)) {
    root.append(svg("line", { class: "grid", x1: left, x2: w - right, y1: y(t * 1e9), y2: y(t * 1e9) }),
      svg("text", { class: "tick", x: left - 6, y: y(t * 1e9) + 4, "text-anchor": "end", text: `${t} GB` }));
  }
  for (const t of ticks(step * 1e3, 6)) {
    root.append(svg("text", { class: "tick", x: x(t / 1e3), y: top + plotH + 16, "text-anchor": "middle", text: `${t} ms` }));
  }
  root.append(svg("line", { class: "hbm-line", x1: left, x2: w - right, y1: y(r.hbm_bytes_per_gpu), y2: y(r.hbm_bytes_per_gpu) }),
    svg("text", { class: "hbm-label", x: w - right, y: y(r.hbm_bytes_per_gpu) - 4, "text-anchor": "end", text: `HBM ${fmtBytes(r.hbm_bytes_per_gpu)}` }));
  mem.forEach((m, k) => {
    const pts = [];
    m.points.forEach(([t, b], j) => {
      if (j) pts.push(`${x(t).toFixed(1)},${y(m.points[j - 1][1]).toFixed(1)}`);
      pts.push(`${x(t).toFixed(1)},${y(b).toFixed(1)}`);
    });
    root.append(svg("polyline", { class: "ly-mem", points: pts.join(" "), fill: "none", stroke: PIECE_COLORS[k % PIECE_COLORS.length],
      "stroke-width": 2, "data-stage": m.stage, "data-peak": m.peak_bytes }, svg("title", { text: `stage ${m.stage}: peak ${fmtBytes(m.peak_bytes)}` })));
  });
  const legend = el("div", { class: "legend-row" }, ...mem.map((m, k) => el("span", {},
    el("i", { class: "swatch", style: `background:${PIECE_COLORS[k % PIECE_COLORS.length]}` }), `stage ${m.stage}: peak ${fmtBytes(m.peak_bytes)}`)));
  node.replaceChildren(root, legend);
}

function drawPlacement(r) {
  const pl = r.timeline.placement;
  const axes = Object.keys(pl.axes);
  let pick = state.extra("layout", "axis");
  if (!axes.includes(pick)) pick = axes.find((a) => pl.axes[a].crosses_fabric) || axes[0] || null;
  $("#ly-axes").replaceChildren(...axes.map((a) => el("button", { type: "button", class: `tab${a === pick ? " active" : ""}`,
    "aria-pressed": a === pick ? "true" : "false", "data-axis": a,
    text: `${a} ${pl.axes[a].size}${pl.axes[a].crosses_fabric ? " · crosses the fabric" : ""}`,
    onclick: () => { state.setExtra("layout", "axis", a); drawPlacement(r); } })));
  const a = pick ? pl.axes[pick] : null;
  $("#ly-place-note").textContent = `${fmtInt(pl.gpus)} GPUs on ${fmtInt(pl.nodes)} nodes of ${pl.gpus_per_node}; `
    + `axis order ${pl.axis_order.join(", ")}. ` + axes.map((k) => `${k}: ${pl.axes[k].size} ranks ${pl.axes[k].stride} apart, `
    + `${pl.axes[k].crosses_fabric ? `across nodes on ${pl.axes[k].link}` : `inside a node on ${pl.axes[k].link}`}`).join("; ")
    + (pl.ranks_drawn < pl.gpus ? `. The first ${fmtInt(pl.ranks_drawn)} ranks are drawn.` : ".");
  const node = $("#ly-place");
  const w = chartWidth(node, 1000);
  const per = pl.gpus_per_node;
  const cols = Math.min(per, 8), cell = 26, pad = 6;
  const boxW = cols * cell + 2 * pad, boxH = Math.ceil(per / cols) * cell + 2 * pad + 14;
  const nodes = Math.ceil(pl.ranks_drawn / per);
  const across = Math.max(1, Math.floor((w + 10) / (boxW + 10)));
  const height = Math.ceil(nodes / across) * (boxH + 10) + 4;
  const group = new Set(a ? a.group_of_rank_0 : []);
  const root = svg("svg", { viewBox: `0 0 ${Math.max(w, boxW + 4)} ${height}`, role: "img",
    "aria-label": `placement: ${pl.nodes} nodes of ${per} GPUs; rank 0's ${pick || ""} group highlighted: ranks ${[...group].join(", ")}` });
  for (let k = 0; k < nodes; k++) {
    const bx = 2 + (k % across) * (boxW + 10), by = 2 + Math.floor(k / across) * (boxH + 10);
    const holds = a && a.group_of_rank_0.some((rk) => Math.floor(rk / per) === k);
    root.append(svg("rect", { class: "ly-node", x: bx, y: by, width: boxW, height: boxH, rx: 6, fill: "#fff",
      stroke: holds && a.crosses_fabric ? "var(--crosses)" : "#b9c2cf", "stroke-width": holds && a.crosses_fabric ? 2.5 : 1 }),
    svg("text", { class: "tick", x: bx + pad, y: by + 12, text: `node ${k}` }));
    for (let j = 0; j < per && k * per + j < pl.ranks_drawn; j++) {
      const rank = k * per + j;
      const cx = bx + pad + (j % cols) * cell, cy = by + 16 + pad + Math.floor(j / cols) * cell;
      const on = group.has(rank);
      const fill = on ? (a.crosses_fabric ? "#d9822b" : "#2e8b57") : "#e8ecf1";
      root.append(svg("rect", { class: "ly-rank", "data-rank": rank, x: cx, y: cy, width: cell - 3, height: cell - 3, rx: 3,
        fill }, svg("title", { text: `rank ${rank}${on ? `: in rank 0's ${pick} group` : ""}` })),
      svg("text", { class: "on-color", x: cx + (cell - 3) / 2, y: cy + 15, "text-anchor": "middle", fill: inkOn(fill),
        "font-size": 9, text: String(rank) }));
    }
  }
  node.replaceChildren(root);
}
