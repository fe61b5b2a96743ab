// View 2: the six strategies on 8 GPUs: the cut, each GPU's piece and bytes, the traffic, when to use it.

import { extra, setExtra } from "./state.js";
import { TRAINING_ENGINES, cliCommand, cliModel, layoutQuery, layoutSlug, planName, takeaway } from "./takeaway.js";
import { $, PIECE_COLORS, el, inkOn, keepFocus, reducedMotion, fmtBytes, fmtInt, fmtRatio, fmtSeconds, formValues, isAbort, latestOnly, onFormChange, showError, svg, tracked } from "./util.js";

const call = latestOnly();
const ladderCall = latestOnly();
let data = null;
let selected = "tp";

export const PRIMARY = "strategy";

export function init() {
  selected = extra("strategies", "strategy") || "tp";
  onFormChange($("#st-form"), update);
  update();
}

// A pasted address: its strategy and inputs.
export function restore() {
  selected = extra("strategies", "strategy") || "tp";
  update();
}

function pick(key) {
  selected = key;
  setExtra("strategies", "strategy", key === "tp" ? null : key);
  render();
}

async function update() {
  const v = formValues($("#st-form"));
  try {
    data = await tracked($("#st-results"), () => call("/api/strategies", { model: v.model, gpu: v.gpu, seq: v.seq }));
    showError($("#st-error"), null);
    render();
    ladder(v);
  } catch (err) {
    if (!isAbort(err)) showError($("#st-error"), err, { seq: "Sequence length" });
  }
}

function render() {
  const cards = data.strategies;
  const s = cards.find((c) => c.key === selected) || cards[0];
  selected = s.key;
  keepFocus($("#st-tabs"), "data-key", () => $("#st-tabs").replaceChildren(
    ...cards.map((c) =>
      el("button", {
        type: "button", role: "tab", class: c.key === s.key ? "tab active" : "tab", "data-key": c.key,
        "aria-selected": c.key === s.key ? "true" : "false", text: c.name,
        onclick: () => pick(c.key),
      }),
    ),
  ));
  $("#st-work").replaceChildren(work(s));
  gpus(s);
  $("#st-collective-title").textContent = `The traffic: ${s.collective}`;
  $("#st-traffic").replaceChildren(traffic(s.picture.pattern));
  facts(s);
  glance();
  takeAway(s);
}

// The selected strategy's bill as a command, a JSON file and an engine's configuration.
function takeAway(s) {
  if (!s.applies) { $("#st-takeaway").replaceChildren(); return; }
  const flags = [["gpu", data.gpu], ["gpus", data.gpus], ...Object.entries(s.layout_request).map(([k, v]) => [k, v]), ["seq", data.seq, 4096]];
  takeaway($("#st-takeaway"), {
    id: "st", command: cliCommand("memory", [cliModel(data.model)], flags), json: s.memory,
    filename: `meshplan-memory-${data.model}-${s.key}-8x${data.gpu}.json`, engines: TRAINING_ENGINES,
    exportQuery: () => ({ model: data.model, gpu: data.gpu, gpus: data.gpus, seq: data.seq, precision: s.memory.precision, ...layoutQuery(s.memory.layout) }),
    exportName: () => planName(data.model, data.gpus, data.gpu, layoutSlug(s.memory.layout, data.gpus)),
  });
}

// The at-a-glance table: the words of each strategy and the heaviest GPU of its layout for this model.
function glance() {
  const head = ["Strategy", "What is split", "Main collective", "When it runs", "Sensitive to", "Placement", `Heaviest GPU (${data.model}, 8 × ${data.gpu})`];
  const rows = data.strategies.map((c) => {
    const worst = c.applies ? Math.max(...c.gpus.map((g) => g.total_bytes)) : null;
    return el("tr", { "data-key": c.key, class: c.key === selected ? "picked" : "" },
      el("th", { scope: "row" }, el("button", { type: "button", class: "link-button", "data-key": c.key, onclick: () => pick(c.key), text: c.name })),
      el("td", { text: c.glance.split }), el("td", { text: c.collective }), el("td", { text: c.glance.when }),
      el("td", { text: c.glance.sensitivity }), el("td", { text: c.glance.placement }),
      el("td", { class: "num", "data-bytes": worst ?? "", text: worst === null ? "does not apply" : fmtBytes(worst) }));
  });
  keepFocus($("#st-glance"), "data-key", () => $("#st-glance").replaceChildren(
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col", text: h })))), el("tbody", {}, ...rows)));
}

// The link ladder for the chosen model: one TP all-reduce timed on each link (GET /api/collectives), and the axes
// whose place, by the placement rule, is on a link of that tier.
async function ladder(v) {
  const size = $("#st-ladder-size");
  if (String(v.model).startsWith("upload:")) {
    $("#st-ladder").replaceChildren();
    size.textContent = "The link ladder needs a catalog model (the collectives report takes catalog models only).";
    return;
  }
  let r;
  try {
    r = await ladderCall("/api/collectives", { model: v.model, seq: v.seq, group: 8 });
  } catch (err) {
    if (!isAbort(err)) {
      size.textContent = `The link ladder could not be computed: ${err.message}`;
      $("#st-ladder").replaceChildren();
    }
    return;
  }
  size.textContent = `One ring all-reduce of ${fmtBytes(r.size_bytes)} (${r.model}'s activations for ${Number(v.seq).toLocaleString("en-US")} tokens) over ${r.group_size} ranks; tensor parallelism runs ${r.tp_collectives_per_forward} of them per forward pass.`;
  const byTier = (tier) => data.strategies.filter((c) => c.glance.tier === tier).sort((a, b) => a.glance.order - b.glance.order).map((c) => c.name.replace(/ \(.*\)$/, "")).join(", then ");
  const head = ["Link", "Tier", "Per direction", "One TP all-reduce", "Modeled", "Slower than the fastest", "Axes that belong here"];
  $("#st-ladder").replaceChildren(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, ...r.links.map((l) => el("tr", { "data-link": l.link },
      el("td", { text: l.link }), el("td", { text: l.tier }), el("td", { text: `${(l.bandwidth_bytes_per_s / 1e9).toFixed(1)} GB/s` }),
      el("td", { "data-s": l.bandwidth_only_s, text: fmtSeconds(l.bandwidth_only_s) }), el("td", { text: fmtSeconds(l.modeled_s) }),
      el("td", { "data-ratio": l.ratio_bandwidth_only, text: `${fmtRatio(l.ratio_bandwidth_only)} (modeled ${fmtRatio(l.ratio_modeled)})` }),
      el("td", { class: "wrap", text: l.tier === "scale-up" ? byTier("scale-up") : `${byTier("scale-out")}; never TP` })))));
}

function gpus(s) {
  const hbm = s.applies ? s.memory.hbm_bytes_per_gpu : null;
  const items = s.gpus.map((g) => {
    const over = s.applies && g.total_bytes > hbm;
    const fill = s.applies ? Math.min(g.total_bytes / hbm, 1) : 0;
    return el("div", { class: "gpu", style: `--piece:${PIECE_COLORS[g.gpu % 8]}`, "data-gpu": g.gpu },
      el("div", { class: "gpu-name", text: `GPU ${g.gpu}` }),
      el("div", { class: "gpu-piece", text: g.piece }),
      el("div", { class: "gpu-bytes", "data-bytes": s.applies ? g.total_bytes : "", text: s.applies ? fmtBytes(g.total_bytes) : "n/a" }),
      el("div", { class: "hbm-bar", title: s.applies ? `${fmtBytes(g.total_bytes)} of ${fmtBytes(hbm)} HBM` : "" },
        el("i", { class: over ? "over" : "", style: `width:${(100 * fill).toFixed(1)}%` })),
      el("div", { class: over ? "gpu-fit over" : "gpu-fit", text: s.applies ? (over ? `over ${fmtBytes(hbm)} HBM` : `fits ${fmtBytes(hbm)} HBM`) : "" }),
    );
  });
  const note = s.applies
    ? el("p", { class: "note" }, `Training bill per GPU for ${data.model} on 8 × ${data.gpu}, ${data.seq.toLocaleString("en-US")}-token sequences, layout `,
        el("code", { text: layoutText(s.memory.layout) }), ".")
    : el("p", { class: "note warn", id: "st-na", text: `Not applicable to ${data.model}: ${s.reason}` });
  $("#st-gpus").replaceChildren(...items, note);
}

function layoutText(l) {
  const parts = ["tp", "pp", "cp", "ep", "dp_shard", "dp_replicate"].filter((k) => l[k] > 1).map((k) => `${k}=${l[k]}`);
  if (l.zero) parts.push(`zero=${l.zero}`);
  if (l.sp) parts.push("sp");
  return parts.join(", ") || "one GPU";
}

// The illustrative object each strategy cuts, drawn with its 8 pieces and the cut lines between them.
function work(s) {
  const W = 420, H = 230;
  const root = svg("svg", { class: "fixed", style: `width:${W}px`, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `what ${s.name} cuts` });
  const cut = s.picture.cut;
  const color = (i) => PIECE_COLORS[i % 8];
  const cutLine = (x1, y1, x2, y2) => root.append(svg("line", { x1, y1, x2, y2, class: "cut" }));
  const label = (t, y = H - 6) => root.append(svg("text", { x: W / 2, y, class: "tick", "text-anchor": "middle", text: t }));
  if (cut === "rows" || cut === "state") {
    const bw = cut === "state" ? 200 : 380;
    for (let i = 0; i < 8; i++) {
      root.append(svg("rect", { x: 20, y: 14 + i * 24, width: bw, height: 18, fill: color(i), rx: 3 }));
      root.append(svg("text", { x: 26, y: 27 + i * 24, class: "on-color", fill: inkOn(color(i)), text: s.gpus[i].piece }));
      if (i) cutLine(14, 11 + i * 24, 26 + bw, 11 + i * 24);
    }
    if (cut === "state") {
      root.append(svg("text", { x: 330, y: 12, class: "tick", "text-anchor": "middle", text: "weights · grads · optimizer" }));
      for (let i = 0; i < 8; i++) root.append(svg("rect", { x: 240 + i * 22.5, y: 18, width: 20, height: 186, fill: color(i), rx: 2 }));
      for (let i = 1; i < 8; i++) cutLine(239 + i * 22.5, 14, 239 + i * 22.5, 208);
    }
    label(cut === "state" ? "the batch (left) and the training state (right), each cut 8 ways" : "the batch: 8 sequences, one per GPU");
  } else if (cut === "columns") {
    for (let layer = 0; layer < 4; layer++) {
      for (let i = 0; i < 8; i++) root.append(svg("rect", { x: 20 + i * 47.5, y: 12 + layer * 50, width: 45, height: 40, fill: color(i), rx: 2 }));
      root.append(svg("text", { x: 16, y: 36 + layer * 50, class: "tick", "text-anchor": "end", text: `L${layer + 1}` }));
    }
    for (let i = 1; i < 8; i++) cutLine(19 + i * 47.5, 6, 19 + i * 47.5, 212);
    label("every layer's matrices cut into 8 column blocks (4 layers drawn)");
  } else if (cut === "layers") {
    for (let i = 0; i < 8; i++) {
      root.append(svg("rect", { x: 60, y: 8 + i * 25, width: 300, height: 22, fill: color(i), rx: 2 }));
      root.append(svg("text", { x: 70, y: 23 + i * 25, class: "on-color", fill: inkOn(color(i)), text: s.gpus[i].piece }));
      if (i) cutLine(50, 6.5 + i * 25, 370, 6.5 + i * 25);
    }
    label(`the stack of ${data.model}'s ${fmtInt(s.picture.units)} layers cut into 8 stages`);
  } else if (cut === "sequence") {
    for (let i = 0; i < 8; i++) {
      root.append(svg("rect", { x: 10 + i * 50, y: 80, width: 48, height: 50, fill: color(i), rx: 2 }));
      root.append(svg("text", { x: 34 + i * 50, y: 146, class: "tick", "text-anchor": "middle", text: `${i + 1}/8` }));
    }
    for (let i = 1; i < 8; i++) cutLine(9 + i * 50, 70, 9 + i * 50, 140);
    label(`one sequence of ${fmtInt(s.picture.units)} tokens (the sequence length asked for) cut into 8 slices of ${fmtInt(Math.ceil(s.picture.units / 8))}`);
  } else if (!s.picture.units) {
    root.append(svg("text", { x: 210, y: 110, class: "tick", "text-anchor": "middle", id: "st-no-experts", text: `${data.model} is dense: no experts to place` }));
    label("a dense model has no experts: expert parallelism does not apply");
  } else {
    // the experts in rows of 16, each GPU's share (the first GPUs one more when 8 does not divide them) in its color
    const units = s.picture.units, cols = 16, rowH = Math.min(12.5, 200 / Math.ceil(units / cols));
    const owner = (e) => { let start = 0; for (let i = 0; i < 8; i++) { const n = Math.floor(units / 8) + (i < units % 8 ? 1 : 0); if (e < start + n) return i; start += n; } return 7; };
    for (let e = 0; e < units; e++) {
      root.append(svg("rect", { x: 20 + (e % cols) * 24, y: 8 + Math.floor(e / cols) * rowH, width: 22, height: rowH * 0.84, fill: color(owner(e)), rx: 1.5, class: "expert" }));
    }
    const per = units % 8 ? `${Math.floor(units / 8)} or ${Math.floor(units / 8) + 1}` : `${units / 8}`;
    label(`${fmtInt(units)} experts of one MoE layer of ${data.model}, ${per} per GPU`);
  }
  return root;
}

// The 8 GPUs and the pattern of their collective; dots travel along the links.
function traffic(pattern) {
  const W = 640, H = pattern === "all-to-all" ? 170 : 110;
  const root = svg("svg", { class: "fixed", style: `width:${W}px`, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `traffic pattern: ${pattern}` });
  const xs = Array.from({ length: 8 }, (_, i) => 40 + i * 80);
  const y = 50;
  const paths = [];
  if (pattern === "chain") {
    for (let i = 0; i < 7; i++) paths.push(`M${xs[i] + 18},${y} L${xs[i + 1] - 18},${y}`);
  } else if (pattern === "ring") {
    for (let i = 0; i < 7; i++) paths.push(`M${xs[i] + 18},${y} L${xs[i + 1] - 18},${y}`);
    paths.push(`M${xs[7]},${y + 18} C${xs[7]},${y + 56} ${xs[0]},${y + 56} ${xs[0]},${y + 18}`);
  } else {
    for (let i = 0; i < 8; i++) for (let j = i + 1; j < 8; j++) {
      const lift = 12 + (j - i) * 12;
      paths.push(`M${xs[i]},${y + 18} Q${(xs[i] + xs[j]) / 2},${y + 18 + lift} ${xs[j]},${y + 18}`);
    }
  }
  paths.forEach((d, k) => {
    root.append(svg("path", { d, class: "link" }));
    const dot = svg("circle", { r: 3.5, class: "dot" });
    // With reduced motion the dots rest at the start of their links.
    if (reducedMotion()) { const [, x0, y0] = d.match(/^M([\d.]+),([\d.]+)/); dot.setAttribute("cx", x0); dot.setAttribute("cy", y0); }
    else dot.append(svg("animateMotion", { dur: `${1.6 + (k % 5) * 0.2}s`, repeatCount: "indefinite", path: d }));
    root.append(dot);
  });
  xs.forEach((x, i) => {
    root.append(svg("rect", { x: x - 18, y: y - 18, width: 36, height: 36, rx: 5, fill: PIECE_COLORS[i] }));
    root.append(svg("text", { x, y: y + 5, class: "on-color", fill: inkOn(PIECE_COLORS[i]), "text-anchor": "middle", text: `${i}` }));
  });
  return root;
}

function facts(s) {
  const rows = [
    ["What is cut", s.cuts], ["What each GPU holds", s.holds], ["Collective", s.collective], ["How often", s.how_often],
    ["Interconnect", s.interconnect], ["When to use it", s.when], ["In published runs", s.example],
  ];
  $("#st-facts").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
}
