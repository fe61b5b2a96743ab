// View 5: published recipes as nested mesh axes from one GPU outward, and every recipe on one fleet ruler.

import { layoutHref } from "./layout.js";
import { extra, setExtra } from "./state.js";
import { TRAINING_ENGINES, cliCommand, layoutQuery, layoutSlug, planName, takeaway } from "./takeaway.js";
import { $, chartWidth, el, inkOn, keepFocus, pressable, fmtBytes, fmtGiB, fmtInt, fmtPct, fmtSeconds, gpuName, isAbort, latestOnly, onResize, showError, svg, tracked } from "./util.js";

const call = latestOnly();
// The axes that multiply to the fleet (EP is carved out of them), innermost first by default.
const MESH = ["tp", "cp", "pp", "dp_shard", "dp_replicate"];
const NAMES = {
  tp: "tensor parallel", cp: "context parallel", pp: "pipeline stages", dp_shard: "data parallel (sharded)",
  dp_replicate: "data-parallel replicas", ep: "expert parallel",
};
const AXIS_COLORS = { tp: "#4e79a7", cp: "#59a14f", pp: "#f28e2b", dp: "#b07aa1", ep: "#e15759" };
let ctx = null;
let report = null;
let depth = 99;
let timer = null;
const DEFAULT = "llama3-405b-128k";

export function init(context) {
  ctx = context;
  $("#rc-play").addEventListener("click", play);
  $("#rc-all").addEventListener("click", () => { clearInterval(timer); depth = 99; nest(); });
  tabs(ctx.catalog.recipes[0].name);
  ruler();
  onResize(ruler);
  select(wanted(), false);
}

export const PRIMARY = "recipe";

function wanted() {
  const names = ctx.catalog.recipes.map((r) => r.name);
  const asked = extra("recipes", "recipe");
  return names.includes(asked) ? asked : names.includes(DEFAULT) ? DEFAULT : names[0];
}

export function restore() {
  select(wanted(), false);
}

function tabs(active) {
  keepFocus($("#rc-tabs"), "data-key", () => $("#rc-tabs").replaceChildren(...ctx.catalog.recipes.map((r) =>
    el("button", {
      type: "button", role: "tab", class: r.name === active ? "tab active" : "tab", "aria-selected": r.name === active ? "true" : "false",
      "data-key": r.name, text: r.title, onclick: () => select(r.name),
    }))));
}

async function select(name, remember = true) {
  if (remember) setExtra("recipes", "recipe", name === DEFAULT ? null : name);
  tabs(name);
  try {
    report = await tracked($("#rc-results"), () => call(`/api/recipe/${encodeURIComponent(name)}`, {}));
    showError($("#rc-error"), null);
  } catch (err) {
    if (!isAbort(err)) showError($("#rc-error"), err);
    return;
  }
  clearInterval(timer);
  depth = 99;
  $("#rc-title").textContent = `${report.title} · ${fmtInt(report.gpus)} × ${gpuName(ctx.catalog, report.gpu)}`;
  $("#rc-why").textContent = report.why;
  verdict(report);
  const r = report;
  // the recipe's layout on the layout page, with the stack and the conditions the recipe states
  const stated = Object.entries(r.conditions || {}).filter(([, c]) => c.source === "flag").map(([k, c]) => [k, c.value]);
  const href = layoutHref({
    model: r.model, gpu: r.gpu, gpus: r.gpus, seq: r.seq, global_batch: r.global_batch, precision: r.precision,
    stack: r.stack, ...layoutQuery(r.layout), expert_tp: r.layout.expert_tp, ...Object.fromEntries(stated),
  });
  $("#rc-source").replaceChildren(`Source: ${r.source}. `, el("a", { href, id: "rc-layout-link" }, "Open this layout's page"), ".");
  takeaway($("#rc-takeaway"), {
    id: "rc", command: cliCommand("recipe", [r.recipe], []), json: r, filename: `meshplan-recipe-${r.recipe}.json`,
    engines: TRAINING_ENGINES,
    exportQuery: () => ({ model: r.model, gpu: r.gpu, gpus: r.gpus, seq: r.seq, global_batch: r.global_batch, precision: r.precision, ...layoutQuery(r.layout) }),
    exportName: () => planName(r.model, r.gpus, r.gpu, layoutSlug(r.layout, r.gpus)),
  });
  const f = report.factors;
  $("#rc-factors").replaceChildren(
    ...Object.entries(f).filter(([k]) => k !== "gpus").map(([k, v]) => el("span", { class: "chip", style: `--c:${AXIS_COLORS[k]}`, text: `${k.toUpperCase()} ${v}` })),
    el("span", { class: "chip total", id: "rc-gpus", "data-gpus": f.gpus, text: `${fmtInt(f.gpus)} GPUs` }),
  );
  nest();
}

const whatIfCall = latestOnly();
const TERM_NAMES = (terms) => Object.fromEntries(terms.map((t) => [t.name, t.title.toLowerCase()]));

// Whether the engine's bill of the recipe fits, and when it does not, by how much, which terms weigh most, and
// what the engine bills for the same layout with recompute (the lever the recipes leave unstated).
async function verdict(r) {
  const node = $("#rc-verdict");
  const stage = r.stages.length > 1 ? ` on stage ${r.heaviest_stage} (the heaviest of ${r.stages.length})` : "";
  if (r.fits) {
    node.replaceChildren(el("strong", { class: "ok", id: "rc-fits", text: "Fits. " }),
      `The engine bills ${fmtBytes(r.per_gpu.total_bytes)} per GPU${stage}, leaving ${fmtBytes(r.free_bytes_per_gpu)} of one ${gpuName(ctx.catalog, r.gpu)}'s ${fmtGiB(r.hbm_bytes_per_gpu)} (${fmtBytes(r.hbm_bytes_per_gpu)}).`);
    return;
  }
  const names = TERM_NAMES(r.terms);
  const big = [...r.terms].sort((a, b) => b.value_bytes - a.value_bytes).slice(0, 2)
    .map((t) => `${names[t.name]} ${fmtBytes(t.value_bytes)}`).join(" and ");
  const say = (extra) => node.replaceChildren(
    el("strong", { class: "bad", id: "rc-fits", text: "Over HBM. " }),
    `The engine bills ${fmtBytes(r.per_gpu.total_bytes)} per GPU${stage}, ${fmtBytes(-r.free_bytes_per_gpu)} more than the ${fmtGiB(r.hbm_bytes_per_gpu)} (${fmtBytes(r.hbm_bytes_per_gpu)}) of one ${gpuName(ctx.catalog, r.gpu)}; `,
    `the largest terms are ${big}. The published run did train this way, so the bill is missing something that run did `,
    "(a recipe states its degrees, not every memory setting). ", ...extra);
  say([]);
  const options = ["selective", "full"].filter((m) => m !== r.layout.recompute);
  try {
    const base = { model: r.model, gpu: r.gpu, gpus: r.gpus, seq: r.seq, global_batch: r.global_batch, precision: r.precision, ...layoutQuery(r.layout) };
    const bills = [];
    for (const recompute of options) bills.push([recompute, await whatIfCall("/api/memory", { ...base, recompute })]);
    if (report !== r) return;
    say(["What it would need: ", ...bills.flatMap(([m, b], i) => [i ? "; " : "", `with ${m} recompute the same layout is billed `,
      el("strong", { "data-recompute": m, "data-bytes": b.per_gpu.total_bytes, text: fmtBytes(b.per_gpu.total_bytes) }),
      b.fits ? " and fits" : ` (${fmtBytes(-b.free_bytes_per_gpu)} over)`]), "."]);
  } catch (err) {
    if (!isAbort(err)) say([`(The engine could not bill the recompute alternatives: ${err.message}.)`]);
  }
}

function levels() {
  return report.axis_order.filter((a) => MESH.includes(a) && report.placement[a]).map((a) => ({ axis: a, ...report.placement[a] }));
}

function box(ls, k) {
  if (k < 0) return el("span", { class: "gpu-dot" });
  const lv = ls[k];
  const shown = Math.min(lv.size, k === 0 ? 8 : 2);
  const where = lv.crosses_fabric
    ? `over ${lv.link}, across ${fmtInt(lv.domains)} NVLink domains`
    : `over ${lv.link}, inside one NVLink domain`;
  return el("div", { class: lv.crosses_fabric ? "nest-box crosses" : "nest-box inside", "data-axis": lv.axis, "data-size": lv.size },
    el("div", { class: "nest-label" }, el("b", { text: `${lv.axis.toUpperCase()} ${lv.size}` }), ` ${NAMES[lv.axis]} · ${where}`),
    el("div", { class: "nest-body" }, ...Array.from({ length: shown }, () => box(ls, k - 1)),
      lv.size > shown ? el("span", { class: "more", text: `… ${fmtInt(lv.size)} in all` }) : null),
  );
}

function nest() {
  const ls = levels();
  const d = Math.min(depth, ls.length);
  const inner = ls.slice(0, d);
  $("#rc-nest").replaceChildren(inner.length ? box(inner, inner.length - 1) : el("span", { class: "gpu-dot solo", title: "one GPU" }));
  const notes = [];
  if (report.placement.ep) {
    const ep = report.placement.ep;
    notes.push(`EP ${ep.size}: the expert groups are carved out of the data-parallel ranks (no factor of their own); they ${ep.crosses_fabric ? `cross the fabric over ${ep.link}` : `stay on ${ep.link}`}.`);
  }
  notes.push("Green boxes keep their traffic inside one NVLink domain; every dashed orange box is an axis whose groups cross the scale-out fabric. Only a representative slice of each level is drawn.");
  notes.push(`Engine estimate for this recipe: ${fmtSeconds(report.step_time_s)} per step (P10-P90 ${fmtSeconds(report.step_time_s_p10)} to ${fmtSeconds(report.step_time_s_p90)}), MFU ${fmtPct(report.mfu)}, ${fmtBytes(report.per_gpu.total_bytes)} per GPU of ${fmtGiB(report.hbm_bytes_per_gpu)} (${fmtBytes(report.hbm_bytes_per_gpu)}) HBM.`);
  $("#rc-notes").replaceChildren(...notes.map((n) => el("span", { class: "block", text: n })));
  $("#rc-play").textContent = d < ls.length ? `▶ Add the next axis (${d} of ${ls.length})` : "▶ Build outward";
}

function play() {
  clearInterval(timer);
  depth = 0;
  nest();
  timer = setInterval(() => {
    depth += 1;
    nest();
    if (depth >= levels().length) clearInterval(timer);
  }, 900);
}

function ruler() {
  const items = ctx.catalog.recipes;
  const maxGpus = Math.max(...items.map((r) => r.factors.gpus));
  const top = 8 ** Math.ceil(Math.log(maxGpus) / Math.log(8));
  const W = Math.max(chartWidth($("#rc-ruler")), 620), L = 160, R = 64, rowH = 34, T = 14;
  const H = T + items.length * rowH + 40;
  const x = (n) => L + ((W - L - R) * Math.log(n)) / Math.log(top);
  const root = svg("svg", { class: "fixed", style: `width:${W}px`, viewBox: `0 0 ${W} ${H}`, role: "group", "aria-label": "fleet ruler, log scale of GPUs; each row opens its recipe" });
  for (let g = 1; g <= top; g *= 8) {
    root.append(svg("line", { x1: x(g), x2: x(g), y1: T - 4, y2: H - 34, class: "grid" }));
    root.append(svg("text", { x: x(g), y: H - 20, class: "tick", "text-anchor": "middle", text: fmtInt(g) }));
  }
  root.append(svg("text", { x: (W + L - R) / 2, y: H - 4, class: "axis-label", "text-anchor": "middle", text: "GPUs (log scale, 8× per gridline)" }));
  items.forEach((r, i) => {
    const y = T + i * rowH;
    const row = svg("g", { class: "ruler-row", "data-recipe": r.name, tabindex: 0, role: "button" });
    pressable(row, () => select(r.name));
    row.append(svg("text", { x: L - 8, y: y + 15, class: "bar-label small", "text-anchor": "end", text: r.name }));
    let at = 1;
    for (const axis of ["tp", "cp", "pp", "dp"]) {
      const f = r.factors[axis];
      if (!f || f <= 1) continue;
      row.append(svg("rect", { x: x(at), y, width: x(at * f) - x(at), height: 24, fill: AXIS_COLORS[axis], rx: 2 },
        svg("title", { text: `${axis.toUpperCase()} ${f}` })));
      if (x(at * f) - x(at) > 26) row.append(svg("text", { x: (x(at) + x(at * f)) / 2, y: y + 16, class: "on-color", fill: inkOn(AXIS_COLORS[axis]), "text-anchor": "middle", text: `${axis.toUpperCase()} ${f}` }));
      at *= f;
    }
    const ep = r.factors.ep ? ` (EP ${r.factors.ep} within DP)` : "";
    row.append(svg("text", { x: x(r.factors.gpus) + 6, y: y + 15, class: "tick", "data-gpus": r.factors.gpus, text: `${fmtInt(r.factors.gpus)}${ep}` }));
    root.append(row);
  });
  $("#rc-ruler").replaceChildren(root);
}
