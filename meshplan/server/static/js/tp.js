// View 4: the TP MLP split in steps, checked by the engine, and one all-reduce raced over four links.

import { extra, setExtra } from "./state.js";
import { $, el, fmtBytes, fmtRatio, fmtSeconds, formValues, isAbort, latestOnly, onFormChange, reducedMotion, showError, svg, tracked, PIECE_COLORS } from "./util.js";

const splitCall = latestOnly();
const raceCall = latestOnly();
const RACE_SECONDS = 8;
const CELL = 8;
let split = null;
let step = 0;
let race = null;
let frame = null;

export function init() {
  onFormChange($("#tp-form"), updateSplit);
  onFormChange($("#race-form"), updateRace);
  step = Number(extra("tp", "step")) || 0;
  $("#tp-prev").addEventListener("click", () => goto(step - 1));
  $("#tp-next").addEventListener("click", () => goto(step + 1));
  $("#race-play").addEventListener("click", play);
  updateSplit();
  updateRace();
}

function goto(k) {
  step = Math.max(0, Math.min(split ? split.steps.length - 1 : 0, k));
  setExtra("tp", "step", step || null);
  drawSplit();
}

export function restore() {
  step = Number(extra("tp", "step")) || 0;
  updateSplit();
  updateRace();
}

async function updateSplit() {
  const v = formValues($("#tp-form"));
  try {
    split = await tracked($("#tp-results"), () => splitCall("/api/tp-split", { ranks: v.ranks, activation: v.activation, seed: v.seed, rows: 4, hidden: 8, ffn: 16 }));
    showError($("#tp-error"), null);
    drawSplit();
  } catch (err) {
    if (!isAbort(err)) showError($("#tp-error"), err);
  }
}

function shapeText(shapes) {
  return Object.entries(shapes).map(([k, [a, b]]) => `${k} [${a} × ${b}]`).join(" · ");
}

function drawSplit() {
  step = Math.min(step, split.steps.length - 1);
  const s = split.steps[step];
  $("#tp-step-label").textContent = `Step ${step + 1} of ${split.steps.length}: ${s.step}`;
  $("#tp-step-label").dataset.step = String(step);
  $("#tp-step-text").textContent = `${s.what[0].toUpperCase()}${s.what.slice(1)}. Shapes: ${shapeText(s.shapes)}.`;
  const t = split.ranks, w = split.ffn / t;
  const root = svg("svg", { class: "fixed", style: "width:760px", viewBox: "0 0 760 345", role: "img", "aria-label": `tensor-parallel MLP, step ${step + 1}` });
  const matrix = (x, y, rows, cols, name, { cutCols = false, cutRows = false, active = true } = {}) => {
    const byCols = cutCols && active, byRows = cutRows && active;
    for (let r = 0; r < t; r++) {
      const fill = byCols || byRows ? PIECE_COLORS[r % 8] : "#c9d3df";
      const rect = byCols
        ? { x: x + r * w * CELL, y, width: w * CELL, height: rows * CELL }
        : byRows ? { x, y: y + r * w * CELL, width: cols * CELL, height: w * CELL } : { x, y, width: cols * CELL, height: rows * CELL };
      root.append(svg("rect", { ...rect, fill, stroke: "#fff", "stroke-width": 1 }));
      if (!byCols && !byRows) break;
    }
    root.append(svg("text", { x: x + (cols * CELL) / 2, y: y - 6, class: "tick", "text-anchor": "middle", text: `${name} [${rows}×${cols}]` }));
  };
  const T = split.tokens, Hd = split.hidden, F = split.ffn;
  matrix(10, 40, T, Hd, "X");
  root.append(svg("text", { x: 86, y: 60, class: "op", text: "·" }));
  matrix(100, 40, Hd, F, "W1", { cutCols: true, active: step >= 1 });
  root.append(svg("text", { x: 236, y: 60, class: "op", text: `→ ${split.activation} →` }));
  matrix(320, 40, T, F, "H", { cutCols: true, active: step >= 1 });
  root.append(svg("text", { x: 456, y: 60, class: "op", text: "·" }));
  matrix(470, 40, F, Hd, "W2", { cutRows: true, active: step >= 2 });
  root.append(svg("text", { x: 546, y: 60, class: "op", text: "=" }));
  matrix(562, 40, T, Hd, "Y");
  if (step >= 2) partials(root);
  if (step >= 3) sums(root);
  $("#tp-chart").replaceChildren(root);
  const ok = split.matches;
  $("#tp-check").replaceChildren(
    el("strong", { id: "tp-matches", class: ok ? "ok" : "bad", text: ok ? "The split equals the unsplit result." : "The split differs from the unsplit result." }),
    " Largest difference |Σ partials − X·W1·W2| = ",
    el("span", { id: "tp-diff", "data-value": split.max_abs_difference, text: split.max_abs_difference.toExponential(2) }),
    ` (${split.dtype}; tolerance ${split.tolerance.toExponential(1)}), over ${split.ranks} rank(s), ${split.activation}, seed ${split.seed}.`,
  );
}

function heat(root, x, y, m, label, scale) {
  m.forEach((row, i) => row.forEach((v, j) => {
    const a = Math.min(Math.abs(v) / scale, 1);
    const fill = v >= 0 ? `rgba(214,39,40,${a.toFixed(3)})` : `rgba(31,119,180,${a.toFixed(3)})`;
    root.append(svg("rect", { x: x + j * CELL, y: y + i * CELL, width: CELL, height: CELL, fill, stroke: "#eee", "stroke-width": 0.5 },
      svg("title", { text: `${label}[${i},${j}] = ${v}` })));
  }));
  root.append(svg("text", { x, y: y - 5, class: "tick", text: label }));
}

function maxAbs(ms) {
  return Math.max(1e-9, ...ms.flat(2).map(Math.abs));
}

function partials(root) {
  const scale = maxAbs([split.unsplit, ...split.ranks_detail.map((r) => r.partial)]);
  root.append(svg("text", { x: 10, y: 200, class: "tick", text: "each rank's partial Y_r (red > 0, blue < 0):" }));
  split.ranks_detail.forEach((r, k) => {
    const x = 10 + k * 84;
    root.append(svg("rect", { x: x - 2, y: 213, width: split.hidden * CELL + 4, height: 4, fill: PIECE_COLORS[k % 8] }));
    heat(root, x, 232, r.partial, `Y_${r.rank}`, scale);
  });
}

function sums(root) {
  const scale = maxAbs([split.unsplit, split.split_sum]);
  heat(root, 10, 300, split.split_sum, "Σ partials (all-reduce)", scale);
  root.append(svg("text", { x: 140, y: 320, class: "op", text: "≈" }));
  heat(root, 180, 300, split.unsplit, "unsplit X·W1·W2", scale);
}

async function updateRace() {
  const v = formValues($("#race-form"));
  try {
    race = await tracked($("#race-results"), () => raceCall("/api/collectives", { model: v.model, group: v.group, seq: v.seq }));
    race.key = v.timing;
    showError($("#race-error"), null);
    drawRace(0);
  } catch (err) {
    if (!isAbort(err)) showError($("#race-error"), err, { group: "Ranks in the ring", seq: "Tokens per micro-batch" });
  }
}

function drawRace(clock) {
  const key = race.key;
  const fastest = race.links[0];
  $("#race-size").textContent = `One ring all-reduce of ${fmtBytes(race.size_bytes)} over ${race.group_size} ranks (bus factor ${race.bus_factor}) for ${race.model}; TP does ${race.tp_collectives_per_forward} of these per forward pass.`;
  const bws = race.links.map((l) => l.bandwidth_bytes_per_s);
  const lo = Math.log10(Math.min(...bws)), hi = Math.log10(Math.max(...bws));
  const rows = race.links.map((l) => {
    const ratio = l[key];
    const progress = Math.min(1, clock / ratio);
    const thick = 6 + 18 * ((Math.log10(l.bandwidth_bytes_per_s) - lo) / Math.max(hi - lo, 1e-9));
    return el("div", { class: "race-row", "data-link": l.link },
      el("div", { class: "race-name" }, el("b", { text: l.link }), ` · ${(l.bandwidth_bytes_per_s / 1e9).toFixed(1)} GB/s per direction · ${l.tier}`),
      el("div", { class: "pipe", style: `height:${thick.toFixed(1)}px` }, el("i", { style: `width:${(100 * progress).toFixed(1)}%` })),
      el("div", { class: "race-stats" },
        el("span", { class: "pct", "data-done": progress >= 1 ? "1" : "0", text: `${(100 * progress).toFixed(0)}%` }),
        " · needs ", el("span", { class: "ratio", "data-ratio": ratio, text: fmtRatio(ratio) }),
        ` · ${fmtSeconds(l.bandwidth_only_s)} on the wire alone, ${fmtSeconds(l.modeled_s)} modeled (${fmtRatio(l.ratio_modeled)})`),
    );
  });
  $("#race").replaceChildren(...rows);
  $("#race-clock").textContent = `clock: ${clock.toFixed(1)}× the ${fastest.link} time`;
  $("#race-note").textContent = key === "ratio_bandwidth_only"
    ? "Durations are the ratios of bus bytes over nominal bandwidth only: latency, efficiency and overlap are left out. Pipe thickness grows with bandwidth (log scale)."
    : "Durations are the modeled ratios: link efficiency and per-step latency included (alpha-beta ring). Pipe thickness grows with bandwidth (log scale).";
  wall();
}

// Why these ratios are half the seed page's 36x and 144x: every bandwidth here is per direction.
function wall() {
  const up = race.links[0];
  const out = race.links.filter((l) => l.tier === "scale-out");
  if (!out.length) { $("#race-wall").textContent = ""; return; }
  const gbs = (b) => `${(b / 1e9).toLocaleString("en-US", { maximumFractionDigits: 1 })} GB/s`;
  const ratios = out.map((l) => `${fmtRatio(l.ratio_bandwidth_only)} for ${l.link}`).join(" and ");
  const doubled = out.map((l) => fmtRatio(2 * l.ratio_bandwidth_only)).join(" and ");
  $("#race-wall").replaceChildren(el("b", { text: "Why per direction: " }),
    `${up.link} moves ${gbs(up.bandwidth_bytes_per_s)} each way; its datasheet's ${gbs(2 * up.bandwidth_bytes_per_s)} adds the two directions. `,
    `A NIC's ${out.map((l) => gbs(l.bandwidth_bytes_per_s)).join(" or ")} is already one direction. Dividing the two-way figure by a one-way one gives the `,
    `${doubled} that some pages quote; a ring all-reduce sends and receives on every link at the same time, so the like-for-like ratios are `,
    el("span", { id: "race-wall-ratios", text: ratios }), ".");
}

function play() {
  if (!race) return;
  cancelAnimationFrame(frame);
  const end = Math.max(...race.links.map((l) => l[race.key]));
  if (reducedMotion()) { drawRace(end); return; } // the finished race, without the motion
  const start = performance.now();
  const tick = (now) => {
    const clock = Math.min(end, (end * (now - start)) / (RACE_SECONDS * 1000));
    drawRace(clock);
    if (clock < end) frame = requestAnimationFrame(tick);
  };
  frame = requestAnimationFrame(tick);
}
