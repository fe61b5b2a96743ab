// View 7: the planner: search, a sortable table of the best plans, the Pareto plot, rejections, a comparison.

import { extra, setExtra } from "./state.js";
import { CONDITION_LABELS, conditionFlags, conditionParams, stackLine } from "./conditions.js";
import { TRAINING_ENGINES, cliCommand, cliModel, layoutQuery, layoutSlug, planName, takeaway } from "./takeaway.js";
import { $, ApiError, api, chartWidth, el, fmtBytes, fmtGB, fmtInt, fmtNum, fmtPct, fmtSeconds, formValues, fmtGiB, gpuName, isAbort, keepFocus, markResults, onResize, pressable, showError, svg, ticks } from "./util.js";

const LABELS = {
  gpus: "GPUs", seq: "Sequence length", global_batch_tokens: "Tokens per step", top: "Plans to show", headroom: "HBM kept free",
  tp: "Pinned TP", pp: "Pinned PP", cp: "Pinned CP", ep: "Pinned EP", micro_batch: "Pinned micro-batch", ...CONDITION_LABELS,
};
let ctx = null;
let result = null;
let sortKey = "rank";
let sortUp = true;
let asked = null; // the form's values of the search shown
let zoom = false; // the Pareto plot zoomed to the table's plans

export function init(context) {
  ctx = context;
  readSort();
  const form = $("#pl-form");
  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  // The results belong to the inputs searched: any edit marks them stale at once (same event, before the next frame).
  for (const type of ["input", "change"]) form.addEventListener(type, staleCheck);
  $("#pl-cancel").addEventListener("click", cancel);
  onResize(() => result && pareto());
  run();
}

// The form's values as the search takes them (what a search asked is compared with what the form reads now).
const inputsKey = (v) => JSON.stringify(Object.entries(v).sort());

// Dim and label the results when the form no longer reads the inputs they answer (and clear that when it does again).
function staleCheck() {
  const node = $("#pl-results");
  if (!asked || node.dataset.stale === "busy") return;
  const now = inputsKey(formValues($("#pl-form")));
  if (now !== asked.key) {
    node.dataset.stale = "inputs";
    node.setAttribute("aria-describedby", "pl-stale-note");
    $("#pl-stale-note").hidden = false;
  } else if (node.dataset.stale === "inputs") {
    delete node.dataset.stale;
    node.removeAttribute("aria-describedby");
    $("#pl-stale-note").hidden = true;
  }
}

let controller = null; // the running search's, to cancel or replace it

function cancel() {
  if (controller) controller.abort();
}

function readSort() {
  zoom = extra("planner", "zoom") === "1";
  sortKey = COLUMNS.some((c) => c[0] === extra("planner", "sort")) ? extra("planner", "sort") : "rank";
  sortUp = extra("planner", "order") !== "down";
}

// A pasted address: its inputs, its sort, and a new search.
export function restore() {
  readSort();
  run();
}

function sortBy(key) {
  sortUp = key === sortKey ? !sortUp : true;
  sortKey = key;
  setExtra("planner", "sort", key === "rank" ? null : key);
  setExtra("planner", "order", sortUp ? null : "down");
  table();
}

export function layoutLabel(l) {
  const parts = [];
  if (l.tp > 1) parts.push(`TP ${l.tp}${l.sp ? "+SP" : ""}`);
  if (l.pp > 1) parts.push(`PP ${l.pp}${l.vpp > 1 ? ` (${l.vpp} virtual)` : ""}`);
  if (l.cp > 1) parts.push(`CP ${l.cp}${l.cp_kind === "all-gather" ? " (K/V all-gathered)" : ""}`);
  if (l.ep > 1) parts.push(`EP ${l.ep}`);
  if (l.dp_shard > 1) parts.push(`DP-shard ${l.dp_shard}`);
  if (l.dp_replicate > 1) parts.push(`DP-replicas ${l.dp_replicate}`);
  if (l.zero) parts.push(`ZeRO-${l.zero}`);
  if (l.recompute !== "none") parts.push(`recompute ${l.recompute}`);
  if (l.micro_batch > 1) parts.push(`mb ${l.micro_batch}`);
  return parts.join(" · ") || "one GPU";
}

// The layout in the form the planner's compare option reads (tp=8,pp=4,...), leaving out what is the default.
function compareText(l) {
  const parts = [`tp=${l.tp}`, `pp=${l.pp}`];
  if (l.vpp > 1) parts.push(`vpp=${l.vpp}`);
  if (l.cp > 1) parts.push(`cp=${l.cp}`);
  if (l.ep > 1) parts.push(`ep=${l.ep}`);
  parts.push(`dp_shard=${l.dp_shard}`, `zero=${l.zero}`);
  if (l.sp) parts.push("sp=true");
  if (l.recompute !== "none") parts.push(`recompute=${l.recompute}`);
  if (l.micro_batch > 1) parts.push(`mb=${l.micro_batch}`);
  if (l.schedule !== (l.vpp > 1 ? "interleaved" : "1f1b")) parts.push(`schedule=${l.schedule}`);
  return parts.join(",");
}

// A plan as the memory view's address reads it (and the layout page's, #layout?...): the searched model, fleet and
// workload, and the plan's layout; the stack and run conditions searched under ride along.
export function planAddress(p) {
  const v = asked, r = result, l = p.layout;
  const q = new URLSearchParams({
    model: r.model, gpu: r.gpu, gpus: String((r.fewest_gpus && r.fewest_gpus.gpus) || r.gpus), seq: String(r.seq),
    global_batch: String(r.global_batch), tp: String(l.tp), pp: String(l.pp), vpp: String(l.vpp), cp: String(l.cp),
    ep: String(l.ep), zero: String(l.zero), sp: l.sp ? "1" : "0", recompute: l.recompute, micro_batch: String(l.micro_batch),
    schedule: l.schedule, cp_kind: String(l.cp_kind).replace("_", "-"), dp_shard: String(l.dp_shard),
  });
  if (v.precision) q.set("precision", v.precision);
  if (v.attention) q.set("attention", v.attention);
  if (v.finetune !== "full") q.set("finetune", v.finetune);
  for (const [k, val] of Object.entries(conditionParams(v))) if (val !== null && val !== undefined && val !== "") q.set(k, val);
  return q.toString();
}

// Layout fields pinned in the form (pin_tp, ...), as /api/plan and `meshplan plan --tp` take them.
const PINS = ["tp", "pp", "cp", "ep", "zero", "recompute", "micro_batch"];
const pins = (v) => Object.fromEntries(PINS.filter((k) => v[`pin_${k}`]).map((k) => [k, v[`pin_${k}`]]));

async function run() {
  // A search already running is replaced: aborting its request ends it on the server (the client left).
  if (controller) controller.abort();
  const mine = (controller = new AbortController());
  const v = formValues($("#pl-form"));
  const params = {
    model: v.model, gpu: v.gpu, gpus: v.gpus, seq: v.seq, global_batch_tokens: v.global_batch_tokens, top: v.top,
    objective: v.objective, headroom: v.headroom, allow_cross_node_tp: v.allow_cross_node_tp, compare: v.compare || null,
    precision: v.precision || null, finetune: v.finetune, scale_out: v.scale_out || null, node_size: v.node_size || null,
    scale_out_bandwidth: v.scale_out_bandwidth || null, nics_per_node: v.nics_per_node || null,
    oversubscription: v.oversubscription || null, profile: v.profile || null, tokens: v.tokens || null, days: v.days || null,
    attention: v.attention || null, kernels: v.kernels || null, axis_order: v.axis_order || null,
    // adapter inputs mean something only when adapters train; freezing only when every parameter does
    lora_rank: v.finetune !== "full" ? v.lora_rank || null : null, lora_targets: v.finetune !== "full" ? v.lora_targets || null : null,
    freeze: v.finetune === "full" ? v.freeze || null : null,
    engine: v.engine || null, ...pins(v), ...conditionParams(v),
  };
  const started = performance.now();
  const progress = $("#pl-progress");
  const fleet = `${v.model} on ${fmtInt(Number(v.gpus) || 0)} × ${gpuName(ctx.catalog, v.gpu)}`;
  const say = () => { $("#pl-progress-text").textContent = `Searching the layouts of ${fleet}… ${((performance.now() - started) / 1000).toFixed(1)} s`; };
  say();
  progress.hidden = false;
  $("#pl-cancel").hidden = false;
  $("#pl-stale-note").hidden = true;
  $("#pl-results").removeAttribute("aria-describedby");
  const wasStale = $("#pl-results").dataset.stale === "inputs";
  markResults($("#pl-results"), "busy");
  if (wasStale) $("#pl-results").dataset.stale = "busy"; // already for other inputs: dimmed without the wait
  const clock = setInterval(say, 100);
  try {
    const answer = await api("/api/plan", params, { signal: mine.signal });
    if (mine !== controller) return; // replaced meanwhile: the newer search draws
    result = answer;
    asked = { ...v, params, key: inputsKey(v) };
    showError($("#pl-error"), null);
    render();
    markResults($("#pl-results"), null);
    staleCheck(); // edited while it ran: the answer is drawn, dimmed, for the inputs it was asked
  } catch (err) {
    if (mine !== controller) return;
    if (isAbort(err)) {
      markResults($("#pl-results"), result ? "error" : null);
      staleCheck();
      showError($("#pl-error"), new Error("Search cancelled: the results below, if any, are those of the last search that finished."));
    } else {
      markResults($("#pl-results"), result ? "error" : null);
      showError($("#pl-error"), err instanceof ApiError && err.status === 429 ? new Error(err.message) : err, LABELS);
    }
  } finally {
    if (mine === controller) {
      clearInterval(clock);
      progress.hidden = true;
      $("#pl-cancel").hidden = true;
      controller = null;
    } else {
      clearInterval(clock);
    }
  }
}

function render() {
  const r = result;
  $("#pl-summary").replaceChildren(
    el("span", { id: "pl-fleet", text: `${r.model} on ${fmtInt(r.gpus)} × ${gpuName(ctx.catalog, r.gpu)}: ` }),
    "evaluated ", el("strong", { id: "pl-evaluated", "data-value": r.evaluated, text: fmtInt(r.evaluated) }),
    " layouts in ", el("span", { text: fmtSeconds(r.elapsed_s) }), "; ",
    el("strong", { id: "pl-feasible", "data-value": r.feasible, text: fmtInt(r.feasible) }),
    ` fit with ${fmtPct(r.headroom_fraction)} of HBM kept free. ${fmtInt(r.global_batch)} sequences of ${fmtInt(r.seq)} tokens per step, objective ${r.objective}. `,
    el("span", { id: "pl-stack", text: `Scored under ${stackLine(r)}.` }),
    r.fewest_gpus ? el("span", { id: "pl-fewest", "data-value": r.fewest_gpus.gpus,
      text: ` The fewest GPUs that train ${Number(r.fewest_gpus.tokens).toExponential(2)} tokens in ${r.fewest_gpus.days} days: ${fmtInt(r.fewest_gpus.gpus)} (the search began at ${fmtInt(r.fewest_gpus.searched_from)}).` }) : "",
    r.cheapest_fleet ? el("span", { id: "pl-cheapest", "data-value": r.cheapest_fleet.gpus,
      text: ` The fleet that trains ${Number(r.cheapest_fleet.tokens).toExponential(2)} tokens for the fewest GPU-hours: ${fmtInt(r.cheapest_fleet.gpus)} GPUs (of ${fmtInt(r.cheapest_fleet.searched_from)} and its halvings).` }) : "",
  );
  table();
  $("#pl-band").textContent = `P10-P90: ${r.uncertainty}.`;
  pareto();
  rejections();
  explain();
  takeAway();
  verdict();
}

const CLOSE = 0.03; // top plans closer than this on the objective are called a tie
const METRICS = {
  "step-time": ["step time", (p) => p.step_time_s, (x) => fmtSeconds(x), -1],
  "fewest-gpus": ["step time", (p) => p.step_time_s, (x) => fmtSeconds(x), -1],
  "tokens-per-gpu": ["tokens/s per GPU", (p) => p.tokens_per_s_per_gpu, (x) => fmtInt(x), 1],
  headroom: ["headroom", (p) => p.free_bytes_per_gpu, (x) => fmtBytes(x), 1],
  cost: ["GPU-hours to train", (p) => (p.goodput ? p.goodput.gpu_hours_total : p.gpu_hours_total), (x) => fmtInt(x), -1],
};

// Say when the best plans are too close to call, and when nothing fits, what would.
function verdict() {
  const r = result, node = $("#pl-verdict");
  if (!r.plans.length) { nothingFits(); return; }
  const [name, metric, fmt] = METRICS[r.objective] || METRICS["step-time"];
  const best = metric(r.plans[0]);
  const near = r.plans.filter((p) => Math.abs(metric(p) - best) <= CLOSE * Math.abs(best));
  if (near.length < 2) { node.replaceChildren(); return; }
  const last = near[near.length - 1];
  node.replaceChildren(el("strong", { id: "pl-tie", "data-value": near.length, text: `The best ${near.length} plans are within ${Math.round(CLOSE * 100)}% of each other` }),
    ` in ${name} (#1 ${fmt(best)}, #${r.plans.indexOf(last) + 1} ${fmt(metric(last))}): closer than an analytical estimate can separate. `,
    "Choose among them on what the ranking leaves out: memory headroom, fewer axes that cross nodes, a schedule your framework runs well.");
}

// Nothing fits on this fleet: the engine's answer (the plan report's nothing_fits) says what would, the lightest
// layout it found, the fewest GPUs (of the fleet sizes searched) on which one fits, and the variants that fit here; each
// way out comes with a button that searches it.
function nothingFits() {
  const r = result, node = $("#pl-verdict"), nf = r.nothing_fits;
  const why = Object.entries(r.rejections).map(([k, n]) => `${k}: ${fmtInt(n)}`).join(", ");
  const retry = (text, set) => el("button", { type: "button", class: "small", onclick: () => {
    const form = $("#pl-form");
    for (const [k, val] of Object.entries(set)) form.elements[k].value = val;
    form.dispatchEvent(new Event("change"));
    run();
  } }, text);
  const out = [el("strong", { class: "bad", id: "pl-nothing", text: "Nothing fits. " }),
    `All ${fmtInt(r.evaluated)} layouts of ${r.model} on ${fmtInt(r.gpus)} × ${gpuName(ctx.catalog, r.gpu)} are rejected (${why}).`];
  if (!nf) { node.replaceChildren(...out); return; }
  if (nf.lightest_layout) {
    out.push(el("span", { class: "block" }, `The lightest, ${layoutLabel(nf.lightest_layout)}, needs `,
      el("strong", { id: "pl-lightest", "data-value": nf.lightest_bytes_per_gpu, text: fmtBytes(nf.lightest_bytes_per_gpu) }),
      ` per GPU against a budget of ${fmtBytes(nf.budget_bytes_per_gpu)}.`));
  }
  const n = nf.fewest_gpus_that_fit;
  out.push(n
    ? el("span", { class: "block" }, `A larger fleet: the smallest of those searched (${nf.fleet_sizes_tried.map((t) => fmtInt(t.gpus)).join(", ")} GPUs) on which a layout fits is `,
        el("strong", { id: "pl-fits-at", "data-value": n, text: `${fmtInt(n)} × ${gpuName(ctx.catalog, r.gpu)}` }), ". ", retry(`Search on ${fmtInt(n)} GPUs`, { gpus: n }))
    : el("span", { class: "block", text: "A larger fleet: none of the fleets searched, up to 64 times this one, fits." }));
  const change = (c) => (c.startsWith("--headroom 0") ? { headroom: "0" } : c.startsWith("--finetune ") ? { finetune: c.split(" ")[1] } : null);
  for (const v of nf.variants) {
    const set = change(v.change);
    out.push(el("span", { class: "block variant" }, `On these ${fmtInt(r.gpus)} GPUs with ${v.change}: ${layoutLabel(v.layout)} fits, ${fmtSeconds(v.step_time_s)} per step. `,
      set ? retry(`Search with ${v.change.replace(/ \(.*\)$/, "")}`, set) : ""));
  }
  out.push(el("span", { class: "block note", text: "Recompute and ZeRO/FSDP are already part of every search: the rejections above include them." }));
  node.replaceChildren(...out);
}

function takeAway() {
  const v = asked, r = result;
  const flags = [
    ["gpu", v.gpu], ["gpus", v.gpus], ["seq", v.seq], ["global_batch_tokens", v.global_batch_tokens], ["top", v.top, 5],
    ["headroom", v.headroom, "0.10"], ["allow_cross_node_tp", v.allow_cross_node_tp], ["objective", v.objective, "step-time"],
    ["precision", v.precision], ["finetune", v.finetune, "full"], ["scale_out", v.scale_out], ["node_size", v.node_size],
    ["scale_out_bandwidth", v.scale_out_bandwidth], ["nics_per_node", v.nics_per_node],
    ["oversubscription", v.oversubscription], ["profile", v.profile],
    ["tokens", v.tokens], ["days", v.days], ["attention", v.attention], ["kernels", v.kernels],
    ["axis_order", v.axis_order], ["lora_rank", v.params.lora_rank], ["lora_targets", v.params.lora_targets], ["freeze", v.params.freeze],
    ["engine", v.engine], ...Object.entries(pins(v)), ...conditionFlags(v), ["compare", v.compare], ["explain", true],
  ];
  const pick = el("select", { id: "pl-export-plan", "aria-label": "plan to export" },
    ...r.plans.map((p, i) => el("option", { value: i, text: `plan #${i + 1}` })));
  takeaway($("#pl-takeaway"), {
    id: "pl", command: cliCommand("plan", [cliModel(v.model)], flags), json: r,
    filename: `meshplan-plan-${r.model}-${r.gpus}x${r.gpu}.json`, engines: r.plans.length ? TRAINING_ENGINES : [], before: [pick],
    exportQuery: () => {
      const p = r.plans[Number(pick.value) || 0];
      return { model: v.model, gpu: r.gpu, gpus: (r.fewest_gpus && r.fewest_gpus.gpus) || r.gpus, seq: r.seq, global_batch: r.global_batch, precision: v.precision || null, ...layoutQuery(p.layout), ...conditionParams(v) };
    },
    exportName: () => {
      const p = r.plans[Number(pick.value) || 0], gpus = (r.fewest_gpus && r.fewest_gpus.gpus) || r.gpus;
      return planName(r.model, gpus, r.gpu, layoutSlug(p.layout, gpus));
    },
  });
}

const dec = (x, d) => x.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
const COLUMNS = [
  ["rank", "#", (p) => p.rank, String],
  ["layout", "Layout", (p) => layoutLabel(p.layout), (x) => x],
  ["step", "Step time (s)", (p) => p.step_time_s, (x) => dec(x, 2)],
  ["band", "P10-P90 (s)", (p) => p.step_time_s_p10, (x, p) => `${dec(x, 2)}-${dec(p.step_time_s_p90, 2)}`],
  ["mfu", "MFU (%)", (p) => p.mfu, (x) => (100 * x).toFixed(1)],
  ["tps", "Tokens/s per GPU", (p) => p.tokens_per_s_per_gpu, (x) => fmtInt(x)],
  ["mem", "Memory per GPU (GB)", (p) => p.per_gpu.total_bytes, (x) => dec(x / 1e9, 1)],
  ["free", "Headroom (GB)", (p) => p.free_bytes_per_gpu, (x) => dec(x / 1e9, 1)],
];

function table() {
  const plans = result.plans.map((p, i) => ({ ...p, rank: i + 1 }));
  const col = COLUMNS.find((c) => c[0] === sortKey) || COLUMNS[0];
  plans.sort((a, b) => {
    const x = col[2](a), y = col[2](b);
    const c = typeof x === "string" ? x.localeCompare(y) : x - y;
    return sortUp ? c : -c;
  });
  const head = el("tr", {}, ...COLUMNS.map(([key, label]) => pressable(el("th", {
    scope: "col", "data-sort": key, class: key === sortKey ? (sortUp ? "sorted up" : "sorted down") : "", tabindex: 0,
    "aria-sort": key === sortKey ? (sortUp ? "ascending" : "descending") : "none", title: `sort by ${label}`,
  }, label), () => sortBy(key))), el("th", { scope: "col" }, "Open"), el("th", { scope: "col" }, el("span", { class: "sr-only", text: "Compare" })));
  const rows = plans.map((p) => el("tr", { "data-rank": p.rank },
    ...COLUMNS.map(([key, , get, fmt]) => el("td", { "data-col": key, "data-value": get(p), text: fmt(get(p), p) })),
    el("td", { class: "open" },
      el("a", { href: `#layout?${planAddress(p)}`, class: "open-layout", "data-rank": p.rank, "aria-label": `open plan #${p.rank}'s layout page` }, "Open"), " ",
      el("a", { href: `#memory?${planAddress(p)}`, class: "open-memory", "data-rank": p.rank, "aria-label": `plan #${p.rank}'s per-stage memory bars` }, "Bars")),
    el("td", {}, el("button", { type: "button", class: "small", text: "Compare", onclick: () => {
      $("#pl-form").elements.compare.value = compareText(p.layout);
      $("#pl-form").dispatchEvent(new Event("change")); // the address keeps the comparison
      run();
    } })),
  ));
  keepFocus($("#pl-table"), "data-sort", () => $("#pl-table").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows)));
}

function pareto() {
  const r = result;
  const hbm = ctx.catalog.gpus.find((g) => g.name === r.gpu)?.hbm_bytes_per_gpu;
  const pts = r.pareto.map((p) => ({ m: p.memory_bytes_per_gpu, t: p.step_time_s, layout: p.layout }));
  const top = r.plans.map((p, i) => ({ m: p.per_gpu.total_bytes, t: p.step_time_s, rank: i + 1, layout: p.layout }));
  const all = [...pts, ...top];
  if (!all.length) { $("#pl-pareto").replaceChildren(el("p", { class: "note", text: "No layout fits: nothing to plot." })); return; }
  const W = chartWidth($("#pl-pareto")), H = 300, L = 64, B = 46, T = 14, R = 16;
  // Zoomed: linear axes around the table's plans only (front points outside them are left out).
  const zoomed = zoom && top.length > 1;
  const span = (vals, pad) => { const lo = Math.min(...vals), hi = Math.max(...vals), d = Math.max(hi - lo, hi * 0.01) * pad; return [lo - d, hi + d]; };
  const [mLo, mMax] = zoomed ? span(top.map((p) => p.m / 1e9), 0.12) : [0, Math.max(...all.map((p) => p.m), hbm || 0) * 1.05 / 1e9];
  // Step times span orders of magnitude along the front: a log axis keeps the knee readable.
  const [tLo, tHi] = zoomed ? span(top.map((p) => p.t), 0.15)
    : [Math.log10(Math.min(...all.map((p) => p.t)) / 1.15), Math.log10(Math.max(...all.map((p) => p.t)) * 1.15)];
  const x = (gb) => L + ((W - L - R) * (gb - mLo)) / (mMax - mLo);
  const y = (s) => T + (H - T - B) * (1 - ((zoomed ? s : Math.log10(s)) - tLo) / Math.max(tHi - tLo, 1e-9));
  const inside = (p) => !zoomed || (p.m / 1e9 >= mLo && p.m / 1e9 <= mMax && p.t >= tLo && p.t <= tHi);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "group", "aria-label": "Pareto front: step time against memory per GPU; each point is a button" });
  for (const g of zoomed ? rangeTicks(mLo, mMax, 6) : ticks(mMax, 6)) root.append(svg("line", { x1: x(g), x2: x(g), y1: T, y2: H - B, class: "grid" }), svg("text", { x: x(g), y: H - B + 16, class: "tick", "text-anchor": "middle", text: fmtNum(g) }));
  for (const s of zoomed ? rangeTicks(tLo, tHi, 5) : logTicks(tLo, tHi)) root.append(svg("line", { x1: L, x2: W - R, y1: y(s), y2: y(s), class: "grid" }), svg("text", { x: L - 6, y: y(s) + 4, class: "tick", "text-anchor": "end", text: fmtNum(+s.toPrecision(3)) }));
  root.append(
    svg("text", { x: (W + L) / 2, y: H - 8, class: "axis-label", "text-anchor": "middle", text: "memory per GPU (GB)" }),
    svg("text", { x: 14, y: (H - B) / 2, class: "axis-label", "text-anchor": "middle", transform: `rotate(-90 14 ${(H - B) / 2})`, text: zoomed ? "step time (s)" : "step time (s, log scale)" }),
  );
  if (hbm && hbm / 1e9 <= mMax) root.append(svg("line", { x1: x(hbm / 1e9), x2: x(hbm / 1e9), y1: T, y2: H - B, class: "hbm-line" }), svg("text", { x: x(hbm / 1e9) - 4, y: T + 10, class: "hbm-label", "text-anchor": "end", text: `${gpuName(ctx.catalog, r.gpu)}: ${fmtGiB(hbm)} (${fmtBytes(hbm)})` }));
  const front = [...pts].filter(inside).sort((a, b) => a.m - b.m);
  root.append(svg("polyline", { points: front.map((p) => `${x(p.m / 1e9)},${y(p.t)}`).join(" "), class: "front" }));
  // Every point is a button (a 24-px target around the dot): click, tap, Enter or Space shows it below the plot.
  const point = (p, cls, r, i) => {
    const name = p.rank ? `#${p.rank} ${layoutLabel(p.layout)}` : `front point ${i + 1}: ${layoutLabel(p.layout)}`;
    const g = svg("g", { class: "pt", tabindex: 0, role: "button", "aria-label": `${name}, ${fmtSeconds(p.t)} per step, ${fmtGB(p.m)} per GPU`, "data-rank": p.rank || null, "data-front": p.rank ? null : i },
      svg("circle", { cx: x(p.m / 1e9), cy: y(p.t), r: 12, class: "hit" }),
      svg("circle", { cx: x(p.m / 1e9), cy: y(p.t), r, class: cls, "data-rank": p.rank || null }));
    root.append(pressable(g, () => pickPoint(p, g)));
  };
  pts.forEach((p, i) => { if (inside(p)) point(p, "pareto-pt", 3.5, i); });
  [...top].reverse().forEach((p) => point(p, "top-pt", 6)); // the best drawn last, on top of a cluster
  // Rank labels where they do not collide: the best first.
  const placed = [];
  for (const p of top) {
    const lx = x(p.m / 1e9) + 8, ly = y(p.t) - 8;
    if (placed.some(([a, b]) => Math.abs(a - lx) < 26 && Math.abs(b - ly) < 14)) continue;
    placed.push([lx, ly]);
    root.append(svg("text", { x: lx, y: ly, class: "tick pt-label", text: `#${p.rank}` }));
  }
  const toggle = el("button", { type: "button", class: "small", id: "pl-zoom", "aria-pressed": zoomed ? "true" : "false", onclick: () => {
    zoom = !zoom;
    setExtra("planner", "zoom", zoom ? "1" : null);
    keepFocus($("#pl-pareto"), "id", pareto);
  } }, zoom ? "Show the whole front" : "Zoom to the table's plans");
  $("#pl-pareto").replaceChildren(root, el("p", { class: "note" }, `Small dots: the ${pts.length} layouts no other layout beats on both axes; large dots: the table's plans. `, top.length > 1 ? toggle : ""));
}

function pickPoint(p, g) {
  for (const n of document.querySelectorAll("#pl-pareto g.pt.selected, #pl-table tr.picked")) n.classList.remove("selected", "picked");
  g.classList.add("selected");
  const best = result.plans[0];
  const items = [el("h4", { id: "pl-point-title", text: p.rank ? `Plan #${p.rank}: ${layoutLabel(p.layout)}` : `On the front: ${layoutLabel(p.layout)}` }),
    el("p", {}, el("strong", { id: "pl-point-time", "data-value": p.t, text: fmtSeconds(p.t) }), " per step, ",
      el("strong", { id: "pl-point-mem", "data-value": p.m, text: fmtGB(p.m) }), " per GPU",
      best && p.rank !== 1 ? ` (the best: ${fmtSeconds(best.step_time_s)}, ${fmtGB(best.per_gpu.total_bytes)}).` : ".")];
  if (p.rank) {
    const row = document.querySelector(`#pl-table tr[data-rank="${p.rank}"]`);
    if (row) row.classList.add("picked");
    const pick = $("#pl-export-plan");
    if (pick) pick.value = String(p.rank - 1);
  }
  if (best && p.rank !== 1) {
    items.push(el("button", { type: "button", class: "small", id: "pl-point-compare", onclick: () => {
      $("#pl-form").elements.compare.value = compareText(p.layout);
      $("#pl-form").dispatchEvent(new Event("change"));
      run();
    } }, "Compare with the best, term by term"));
  }
  $("#pl-point").replaceChildren(...items);
}

// Round ticks between lo and hi (1, 2 or 5 times a power of ten apart).
function rangeTicks(lo, hi, count) {
  const raw = (hi - lo) / count;
  const p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * p).find((st) => st >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(+v.toPrecision(6));
  return out;
}

// 1, 2 and 5 times each power of ten between 10^lo and 10^hi (fewer when the range is wide).
function logTicks(lo, hi) {
  const steps = hi - lo > 2.5 ? [1] : [1, 2, 5];
  const out = [];
  for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) {
    for (const m of steps) {
      const v = m * 10 ** e;
      if (Math.log10(v) >= lo && Math.log10(v) <= hi) out.push(v);
    }
  }
  return out;
}

function rejections() {
  const entries = Object.entries(result.rejections);
  $("#pl-rejections").replaceChildren(
    el("thead", {}, el("tr", {}, el("th", { text: "Reason" }), el("th", { text: "Layouts" }))),
    el("tbody", {}, ...entries.map(([why, n]) => el("tr", {}, el("td", { text: why }), el("td", { "data-value": n, text: fmtInt(n) })))),
  );
}

function explain() {
  const blocks = (result.explain || []).map((item) => {
    const rows = item.rows.filter((row) => row.value_a !== 0 || row.value_b !== 0);
    const fmt = (row, v) => (row.unit === "s" ? fmtSeconds(v) : fmtGB(v, 2));
    // A named layout gets a short column header; its full text heads the block.
    const bName = item.named ? "named layout" : item.b;
    const fits = item.named && item.named.fits === false ? " (does not fit)" : "";
    return el("div", { class: "explain", "data-b": item.b },
      el("h4", { text: item.named ? `${item.a} against ${layoutLabel(item.named.layout)}${fits}` : `${item.a} against ${item.b}` }),
      el("p", { class: "why", text: item.why }),
      el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, el("th", { text: "Term" }), el("th", { text: item.a }), el("th", { text: bName }), el("th", { text: "Difference" }))),
        el("tbody", {}, ...rows.map((row) => el("tr", {},
          el("td", { text: row.term.replace(/_bytes$/, "").replaceAll("_", " ") }),
          el("td", { text: fmt(row, row.value_a) }), el("td", { text: fmt(row, row.value_b) }),
          el("td", { class: row.difference > 0 ? "worse" : row.difference < 0 ? "better" : "", text: `${row.difference > 0 ? "+" : ""}${fmt(row, row.difference)}` }),
        ))),
      )),
    );
  });
  $("#pl-explain").replaceChildren(...(blocks.length ? blocks : [el("p", { class: "note", text: "Fewer than two plans fit: nothing to compare." })]));
}
