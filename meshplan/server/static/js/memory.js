// View 1: what one GPU holds for any layout: one training bar per distinct pipeline stage (first, heaviest, last)
// and the serving bar of one replica, each segment a term of the engine's bill, against the GPU's HBM line.

import { CONDITION_LABELS, conditionFlags, conditionParams, conditionsList } from "./conditions.js";
import { SERVING_ENGINES, TRAINING_ENGINES, cliCommand, cliModel, layoutSlug, planName, takeaway } from "./takeaway.js";
import { $, TERM_COLORS, bytesDetail, chartWidth, debounce, el, fmtBytes, fmtGiB, fmtInt, fmtNum, fmtPct, fmtSeconds, formValues, gpuName, isAbort, latestOnly, onFormChange, onResize, showError, svg, ticks, tracked } from "./util.js";

const call = latestOnly();
const api2 = latestOnly();
const est = latestOnly();
const LABELS = {
  seq: "Sequence length", context: "Sequence length", micro_batch: "Micro-batch", sequences: "Micro-batch", gpus: "GPUs",
  dp_shard: "ZeRO shard group", global_batch: "Global batch",
  tp: "TP", pp: "PP", vpp: "Virtual stages", cp: "CP", ep: "EP", zero: "ZeRO", ...CONDITION_LABELS,
};
const LEFT = 120;
const RIGHT = 16;
const BAR_H = 40;
const BAR_GAP = 30;
let ctx = null;
let last = null;
let picked = null; // { bar, name } of the term whose details are shown

export function init(context) {
  ctx = context;
  const form = $("#mem-form");
  onFormChange(form, update, 0); // each change asks at the next frame: a newer one aborts the request in flight
  // The file input sits in the form: keep its events from re-running the bill (which would hide an upload error).
  $("#mem-upload").addEventListener("input", (e) => e.stopPropagation());
  $("#mem-upload").addEventListener("change", (e) => { e.stopPropagation(); upload(e); });
  onResize(() => last && draw(...last));
  update();
}

async function upload(event) {
  const file = event.target.files[0];
  if (!file) return;
  const error = $("#mem-error");
  try {
    const text = await file.text();
    // A file called config.json says nothing: then the server names the model from the config itself.
    const name = file.name.replace(/\.json$/i, "").replace(/^config$/i, "");
    const response = await fetch(name ? `/api/model?name=${encodeURIComponent(name)}` : "/api/model", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: text,
    });
    const body = await response.json().catch(() => ({ error: `the server answered ${response.status}` }));
    if (!response.ok) throw new Error(`The config.json was refused: ${body.error}`);
    ctx.addUpload({ id: body.id, name: body.name });
    $("#mem-form").elements.model.value = body.id;
    $("#mem-form").dispatchEvent(new Event("change")); // recompute, and keep the model in the address
  } catch (err) {
    showError(error, err);
  } finally {
    event.target.value = "";
  }
}

// The /api/memory query for the form's values (also what the CLI command and the download use).
export function memoryParams(v) {
  return {
    model: v.model, gpu: v.gpu, gpus: v.gpus, tp: v.tp, pp: v.pp, vpp: v.vpp, cp: v.cp, ep: v.ep, zero: v.zero,
    sp: v.sp ? "true" : null, micro_batch: v.micro_batch, seq: v.seq, precision: v.precision || null, optimizer: v.optimizer,
    recompute: v.recompute, finetune: v.finetune, schedule: v.schedule || null, cp_kind: v.cp_kind, dp_shard: v.dp_shard || null,
    expert_tp: v.expert_tp || null, attention: v.attention || null, global_batch: v.global_batch || null, ...conditionParams(v),
  };
}

// One serving replica of the same TP x PP split: the bill per GPU of that replica.
function servingParams(v) {
  const tp = Number(v.tp) || 1, pp = Number(v.pp) || 1;
  return { model: v.model, gpu: v.gpu, gpus: tp * pp, tp, pp, context: v.seq, sequences: v.micro_batch, dtype: v.dtype, kv_dtype: v.kv_dtype };
}

async function update() {
  const v = formValues($("#mem-form"));
  const results = $("#mem-results");
  try {
    const [train, serve] = await tracked(results, () => Promise.all([
      call("/api/memory", memoryParams(v)),
      // A serving split the engine refuses must not hide the training bill: the serving bar is then left out.
      api2("/api/serving", servingParams(v)).catch((err) => { if (isAbort(err)) throw err; return { error: err }; }),
    ]));
    showError($("#mem-error"), null);
    draw(train, serve);
    takeAway(v, train); // in the same task as the bars: the page is whole when the new total shows
    $("#mem-time").dataset.pending = "1";
    timingSoon(v, train); // once the inputs rest a moment: typing asks for the bill, not for every estimate
  } catch (err) {
    if (!isAbort(err)) showError($("#mem-error"), err, LABELS);
  }
}

// The step time and MFU of the same layout (/api/estimate, `meshplan estimate`), asked after the bill is drawn so
// that the bars never wait for it; a refused estimate says why without hiding the bill.
const timingSoon = debounce((v, train) => timing(v, train), 100);

async function timing(v, train) {
  const node = $("#mem-time");
  try {
    const e = await est("/api/estimate", memoryParams(v));
    if (!last || last[0] !== train) return;
    delete node.dataset.pending;
    node.replaceChildren(
      "Step time ", el("strong", { id: "mem-step-time", "data-value": e.step_time_s, text: fmtSeconds(e.step_time_s) }),
      ` (P10-P90 ${fmtSeconds(e.step_time_s_p10)} to ${fmtSeconds(e.step_time_s_p90)}), MFU `,
      el("strong", { id: "mem-mfu", "data-value": e.mfu, text: fmtPct(e.mfu) }),
      `, ${fmtInt(e.tokens_per_s_per_gpu)} tokens/s per GPU at ${fmtInt(e.global_batch)} sequences per step, by the engine's step-time model (meshplan estimate). `,
      el("a", { href: `#layout?${layoutAddress(v)}`, id: "mem-layout-link" }, "Open this layout's page"),
    );
  } catch (err) {
    if (isAbort(err)) return;
    delete node.dataset.pending;
    node.replaceChildren(el("span", { class: "warn", id: "mem-time-refused", text: `Step time: not estimated (${err.message}).` }));
  }
}

// The memory form's fields that differ from its defaults, as the address writes them: what #layout?... and
// #memory?... read.
export function layoutAddress(v) {
  const q = new URLSearchParams();
  for (const f of $("#mem-form").elements) {
    if (!f.name || f.type === "file" || !(f.name in v)) continue;
    const dflt = f.type === "checkbox" ? f.defaultChecked : f.tagName === "SELECT" ? (f.dataset.default ?? f.options[0]?.value ?? "") : f.defaultValue;
    if (v[f.name] !== dflt) q.set(f.name, f.type === "checkbox" ? (v[f.name] ? "1" : "0") : v[f.name]);
  }
  return q.toString();
}

function takeAway(v, train) {
  const flags = [
    ["gpu", v.gpu], ["gpus", v.gpus], ["tp", v.tp, 1], ["pp", v.pp, 1], ["vpp", v.vpp, 1], ["cp", v.cp, 1], ["ep", v.ep, 1],
    ["zero", v.zero, 0], ["sp", v.sp], ["recompute", v.recompute, "none"], ["micro_batch", v.micro_batch, 1], ["seq", v.seq, 4096],
    ["precision", v.precision], ["optimizer", v.optimizer, "adamw"], ["finetune", v.finetune, "full"],
    ["schedule", v.schedule], ["cp_kind", v.cp_kind, "ring"], ["dp_shard", v.dp_shard], ["expert_tp", v.expert_tp], ["attention", v.attention],
    ["global_batch", v.global_batch], ...conditionFlags(v),
  ];
  const q = memoryParams(v);
  takeaway($("#mem-takeaway"), {
    id: "mem", command: cliCommand("memory", [cliModel(v.model)], flags), json: train,
    filename: `meshplan-memory-${train.model}.json`, engines: [...TRAINING_ENGINES, ...SERVING_ENGINES],
    exportQuery: (engine) => (SERVING_ENGINES.includes(engine)
      ? { ...servingParams(v), sequences: null }
      : { model: q.model, gpu: q.gpu, gpus: q.gpus, tp: q.tp, pp: q.pp, vpp: q.vpp, cp: q.cp, ep: q.ep, zero: q.zero, sp: q.sp,
          recompute: q.recompute, micro_batch: q.micro_batch, seq: q.seq, precision: q.precision, schedule: q.schedule,
          cp_kind: q.cp_kind, dp_shard: q.dp_shard, expert_tp: q.expert_tp, global_batch: q.global_batch, ...conditionParams(v) }),
    exportName: (engine) => (SERVING_ENGINES.includes(engine)
      ? planName(train.model, (Number(v.tp) || 1) * (Number(v.pp) || 1), v.gpu, `tp${v.tp}-pp${v.pp}`)
      : planName(train.model, train.gpus, train.gpu, layoutSlug(train.layout, train.gpus))),
  });
}

function trainingWhat(train) {
  if (train.finetune === "full") return "every parameter trains";
  return `${train.finetune === "qlora" ? "QLoRA" : "LoRA"}: ${train.trainable_params.toLocaleString("en-US")} adapter parameters train`;
}

function layoutWords(l) {
  const parts = [];
  if (l.tp > 1) parts.push(`TP ${l.tp}${l.sp ? "+SP" : ""}`);
  if (l.pp > 1) parts.push(`PP ${l.pp}${l.vpp > 1 ? ` × ${l.vpp} virtual` : ""}`);
  if (l.cp > 1) parts.push(`CP ${l.cp}${l.cp_kind === "all-gather" ? " (K/V all-gathered)" : ""}`);
  if (l.ep > 1) parts.push(`EP ${l.ep}`);
  if (l.dp_shard > 1) parts.push(`DP-shard ${l.dp_shard}`);
  if (l.dp_replicate > 1) parts.push(`DP-replicas ${l.dp_replicate}`);
  if (l.zero) parts.push(`ZeRO-${l.zero}`);
  return parts.join(", ") || "not split";
}

// The stages that get a bar: the first, the heaviest and the last, each once.
export function shownStages(train) {
  const n = train.stages.length;
  const idx = [...new Set([0, train.heaviest_stage, n - 1])].sort((a, b) => a - b);
  return idx.map((i) => {
    const roles = [];
    if (n > 1 && i === 0) roles.push("first");
    if (i === train.heaviest_stage && n > 1) roles.push("heaviest");
    if (n > 1 && i === n - 1) roles.push("last");
    const label = n > 1 ? `Stage ${i}` : "Training";
    return { key: `stage-${i}`, stage: i, label, roles, bill: train.stages[i] };
  });
}

let drawnAt = 0;

function draw(train, serve) {
  last = [train, serve];
  drawnAt = performance.now();
  const W = chartWidth($("#mem-chart"));
  const stages = shownStages(train);
  const heavy = train.per_gpu.total_bytes;
  const serving = serve && !serve.error ? serve : null;
  const serveTotal = serving ? serving.bill.total_bytes : 0;
  const l = train.layout;
  const perStage = stages.length > 1
    ? [" Per stage: ", ...stages.flatMap((s, k) => [k ? ", " : "", `stage ${s.stage}${s.roles.length ? ` (${s.roles.join(", ")})` : ""} `,
        el("strong", { class: "stage-total", "data-stage": s.stage, "data-bytes": s.bill.total_bytes, text: fmtBytes(s.bill.total_bytes) })]), "."]
    : [el("span", { class: "stage-total", "data-stage": 0, "data-bytes": train.stages[0].total_bytes, hidden: true })];
  // the verdict right after the total: on a phone the peeking bar shows the headline's first words
  $("#mem-headline").replaceChildren(
    el("span", { text: "Training: " }),
    el("strong", { id: "mem-training-total", "data-bytes": heavy, text: fmtBytes(heavy) }),
    el("span", { text: " per GPU, " }),
    el("strong", { id: "mem-fits", class: train.fits ? "ok" : "bad", title: bytesDetail(train.hbm_bytes_per_gpu),
      text: train.fits ? `fits in its ${fmtGiB(train.hbm_bytes_per_gpu)} (${fmtBytes(train.hbm_bytes_per_gpu)})` : `over by ${fmtBytes(-train.free_bytes_per_gpu)}: it has ${fmtGiB(train.hbm_bytes_per_gpu)} (${fmtBytes(train.hbm_bytes_per_gpu)})` }),
    el("span", { text: `; ${train.stages.length > 1 ? "the heaviest stage " : ""}of ${train.gpus.toLocaleString("en-US")} × ${gpuName(ctx.catalog, train.gpu)} (${layoutWords(l)}; ${trainingWhat(train)}, ${train.precision}, ${train.seq.toLocaleString("en-US")} tokens × micro-batch ${l.micro_batch})` }),
    ".", ...perStage,
    serving
      ? el("span", {}, " Serving: ", el("strong", { id: "mem-serving-total", "data-bytes": serveTotal, text: fmtBytes(serveTotal) }),
        ` per GPU of one replica on ${serving.gpus} GPU(s) (TP ${serving.tp}, PP ${serving.pp}), ${serving.bill.sequences} sequence(s) of ${serving.context.toLocaleString("en-US")} tokens in the KV cache.`)
      : el("span", { class: "warn", id: "mem-serving-refused", text: ` Serving: not drawn (${serve && serve.error ? serve.error.message : "no answer"}).` }),
  );
  const bars = stages.map((s) => ({
    key: s.key, label: s.label, sub: s.roles.join(", "), stage: s.stage,
    terms: train.terms.map((t) => ({ ...t, value_bytes: s.bill[t.name] ?? 0 })),
  }));
  if (serving) bars.push({ key: "serving", label: "Serving", sub: "one replica", terms: serving.bill.terms });
  bars.forEach((b, i) => { b.y = 28 + i * (BAR_H + BAR_GAP); });
  const axisY = 28 + bars.length * (BAR_H + BAR_GAP) - BAR_GAP + 12;
  const H = axisY + 40;
  const max = Math.max(...stages.map((s) => s.bill.total_bytes), serveTotal, train.hbm_bytes_per_gpu) * 1.04;
  const unit = max >= 2e12 ? 1e12 : 1e9;
  const unitName = unit === 1e12 ? "TB" : "GB";
  const x = (b) => LEFT + ((W - LEFT - RIGHT) * b) / max;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "group", "aria-label": "memory bill per GPU, one bar per pipeline stage shown and one for serving" });
  for (const t of ticks(max / unit)) {
    root.append(
      svg("line", { x1: x(t * unit), x2: x(t * unit), y1: 22, y2: axisY, class: "grid" }),
      svg("text", { x: x(t * unit), y: axisY + 16, class: "tick", "text-anchor": "middle", text: fmtNum(t) }),
    );
  }
  root.append(svg("text", { x: (W + LEFT) / 2, y: axisY + 34, class: "axis-label", "text-anchor": "middle", text: `per GPU (${unitName}, 1 ${unitName} = 10^${unit === 1e12 ? 12 : 9} bytes)` }));
  for (const bar of bars) {
    root.append(svg("text", { x: LEFT - 8, y: bar.y + (bar.sub ? 18 : 26), class: "bar-label", "text-anchor": "end", text: bar.label }));
    if (bar.sub) root.append(svg("text", { x: LEFT - 8, y: bar.y + 34, class: "tick", "text-anchor": "end", text: bar.sub }));
    let acc = 0;
    for (const term of bar.terms) {
      if (!(term.value_bytes > 0)) continue;
      const rect = svg("rect", {
        x: x(acc), y: bar.y, width: Math.max(x(acc + term.value_bytes) - x(acc), 0.5), height: BAR_H,
        fill: TERM_COLORS[term.name] || "#999", class: "segment", tabindex: 0, role: "button",
        "data-bar": bar.key, "data-term": term.name, "data-bytes": term.value_bytes,
        "aria-label": `${bar.label}: ${term.title}, ${fmtBytes(term.value_bytes)}`,
      });
      const pick = () => detail(bar, term, rect);
      rect.addEventListener("click", pick);
      // A redraw under a resting pointer also "enters" a segment: only a moving pointer picks one on hover.
      rect.addEventListener("mouseenter", (e) => { if (e.movementX || e.movementY || performance.now() - drawnAt > 300) pick(); });
      rect.addEventListener("focus", pick);
      root.append(rect);
      acc += term.value_bytes;
    }
  }
  const hx = x(train.hbm_bytes_per_gpu);
  root.append(
    svg("line", { x1: hx, x2: hx, y1: 16, y2: axisY, class: "hbm-line" }),
    svg("text", {
      x: hx > W * 0.6 ? hx - 4 : hx + 4, y: 14, class: "hbm-label", "text-anchor": hx > W * 0.6 ? "end" : "start",
      text: `one ${gpuName(ctx.catalog, train.gpu)}: ${fmtGiB(train.hbm_bytes_per_gpu)} (${fmtBytes(train.hbm_bytes_per_gpu)})`,
    }),
  );
  $("#mem-chart").replaceChildren(root);
  const open = $("#mem-conditions") && $("#mem-conditions").open;
  $("#mem-conditions-box").replaceChildren(conditionsList(train));
  if (open) $("#mem-conditions").open = true;
  legend(bars);
  // Keep the details open on the same term, with its new value.
  const bar = picked && bars.find((b) => b.key === picked.bar);
  const term = bar && bar.terms.find((t) => t.name === picked.name && t.value_bytes > 0);
  if (term) detail(bar, term, document.querySelector(`#mem-chart rect[data-bar="${bar.key}"][data-term="${term.name}"]`));
}

// Also the way to reach segments too thin to tap: one button per term of each bar.
function legend(bars) {
  $("#mem-legend").replaceChildren(...bars.map((bar) => el("div", { class: "legend-row" },
    el("span", { class: "legend-bar", text: `${bar.label}:` }),
    ...bar.terms.filter((t) => t.value_bytes > 0).map((t) => el("button", {
      type: "button", class: "key", "data-bar": bar.key, "data-term": t.name,
      onclick: () => detail(bar, t, document.querySelector(`#mem-chart rect[data-bar="${bar.key}"][data-term="${t.name}"]`)),
    }, el("i", { style: `background:${TERM_COLORS[t.name]}` }), `${t.title} ${fmtBytes(t.value_bytes)}`)),
  )));
}

function detail(bar, term, rect) {
  picked = { bar: bar.key, name: term.name };
  for (const r of document.querySelectorAll("#mem-chart rect.selected")) r.classList.remove("selected");
  if (rect) rect.classList.add("selected");
  $("#mem-detail").replaceChildren(
    el("h4", {}, el("span", { class: "swatch", style: `background:${TERM_COLORS[term.name]}` }), `${bar.label}${bar.sub ? ` (${bar.sub})` : ""} · ${term.title}: `,
      el("span", { id: "mem-detail-value", "data-bytes": term.value_bytes, text: fmtBytes(term.value_bytes) })),
    el("p", { text: term.what }),
    el("p", {}, el("b", { text: "Formula: " }), el("code", { text: term.formula })),
    el("p", { class: "note" }, el("b", { text: "Source: " }), term.source),
  );
}
