// View 1: the memory bill of one unsplit copy of a model, training against serving, one segment per term.

import { $, TERM_COLORS, chartWidth, el, fmtBytes, formValues, isAbort, latestOnly, onFormChange, onResize, showError, svg, ticks } from "./util.js";

const call = latestOnly();
const LABELS = {
  seq: "Sequence length", context: "Sequence length", micro_batch: "Batch", global_batch: "Batch", sequences: "Batch",
};
const LEFT = 92;
const RIGHT = 16;
let ctx = null;
let last = null;
let picked = null; // { bar, name } of the term whose details are shown

export function init(context) {
  ctx = context;
  const form = $("#mem-form");
  onFormChange(form, update);
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
    update();
  } catch (err) {
    showError(error, err);
  } finally {
    event.target.value = "";
  }
}

async function update() {
  const v = formValues($("#mem-form"));
  const common = { model: v.model, gpu: v.gpu, gpus: 1 };
  try {
    const [train, serve] = await Promise.all([
      call("/api/memory", {
        ...common,
        seq: v.seq,
        micro_batch: v.batch,
        global_batch: v.batch,
        precision: v.precision,
        optimizer: v.optimizer,
        recompute: v.recompute,
        finetune: v.finetune,
      }),
      api2("/api/serving", { ...common, context: v.seq, sequences: v.batch, dtype: v.dtype, kv_dtype: v.kv_dtype }),
    ]);
    showError($("#mem-error"), null);
    draw(train, serve);
  } catch (err) {
    if (!isAbort(err)) showError($("#mem-error"), err, LABELS);
  }
}

const api2 = latestOnly();

function trainingWhat(train) {
  if (train.finetune === "full") return "every parameter trains";
  return `${train.finetune === "qlora" ? "QLoRA" : "LoRA"}: ${train.trainable_params.toLocaleString("en-US")} adapter parameters train`;
}

function draw(train, serve) {
  last = [train, serve];
  const W = chartWidth($("#mem-chart"));
  const trainTotal = train.per_gpu.total_bytes;
  const serveTotal = serve.bill.total_bytes;
  $("#mem-headline").replaceChildren(
    el("span", { text: "Training: " }),
    el("strong", { id: "mem-training-total", "data-bytes": trainTotal, text: fmtBytes(trainTotal) }),
    el("span", { text: ` per unsplit copy (${trainingWhat(train)}, ${train.precision}, ${train.seq.toLocaleString("en-US")} tokens × ${train.global_batch}). Serving: ` }),
    el("strong", { id: "mem-serving-total", "data-bytes": serveTotal, text: fmtBytes(serveTotal) }),
    el("span", { text: ` with ${serve.bill.sequences} sequence(s) of ${serve.context.toLocaleString("en-US")} tokens in the KV cache. One ${train.gpu} has ${fmtBytes(train.hbm_bytes_per_gpu)}.` }),
  );
  const bars = [
    { key: "training", label: "Training", terms: train.terms, y: 34 },
    { key: "serving", label: "Serving", terms: serve.bill.terms, y: 104 },
  ];
  const max = Math.max(trainTotal, serveTotal, train.hbm_bytes_per_gpu) * 1.04;
  const unit = max >= 2e12 ? 1e12 : 1e9;
  const unitName = unit === 1e12 ? "TB" : "GB";
  const x = (b) => LEFT + ((W - LEFT - RIGHT) * b) / max;
  const root = svg("svg", { viewBox: `0 0 ${W} 200`, role: "img", "aria-label": "memory bill, training and serving" });
  for (const t of ticks(max / unit)) {
    root.append(
      svg("line", { x1: x(t * unit), x2: x(t * unit), y1: 24, y2: 160, class: "grid" }),
      svg("text", { x: x(t * unit), y: 176, class: "tick", "text-anchor": "middle", text: `${t}` }),
    );
  }
  root.append(svg("text", { x: (W + LEFT) / 2, y: 196, class: "axis-label", "text-anchor": "middle", text: `memory (${unitName}, 1 ${unitName} = 10^${unit === 1e12 ? 12 : 9} bytes)` }));
  for (const bar of bars) {
    root.append(svg("text", { x: LEFT - 8, y: bar.y + 26, class: "bar-label", "text-anchor": "end", text: bar.label }));
    let acc = 0;
    for (const term of bar.terms) {
      if (!(term.value_bytes > 0)) continue;
      const rect = svg("rect", {
        x: x(acc), y: bar.y, width: Math.max(x(acc + term.value_bytes) - x(acc), 0.5), height: 40,
        fill: TERM_COLORS[term.name] || "#999", class: "segment", tabindex: 0, role: "button",
        "data-bar": bar.key, "data-term": term.name, "data-bytes": term.value_bytes,
        "aria-label": `${bar.label}: ${term.title}, ${fmtBytes(term.value_bytes)}`,
      });
      const pick = () => detail(bar.label, term, rect);
      rect.addEventListener("click", pick);
      rect.addEventListener("mouseenter", pick);
      rect.addEventListener("focus", pick);
      root.append(rect);
      acc += term.value_bytes;
    }
  }
  const hx = x(train.hbm_bytes_per_gpu);
  root.append(
    svg("line", { x1: hx, x2: hx, y1: 20, y2: 160, class: "hbm-line" }),
    svg("text", {
      x: hx > W * 0.6 ? hx - 4 : hx + 4, y: 18, class: "hbm-label", "text-anchor": hx > W * 0.6 ? "end" : "start",
      text: `one ${train.gpu}: ${fmtBytes(train.hbm_bytes_per_gpu)} HBM`,
    }),
  );
  $("#mem-chart").replaceChildren(root);
  legend(bars);
  // Keep the details open on the same term, with its new value.
  const bar = picked && bars.find((b) => b.key === picked.bar);
  const term = bar && bar.terms.find((t) => t.name === picked.name && t.value_bytes > 0);
  if (term) detail(bar.label, term, document.querySelector(`#mem-chart rect[data-bar="${bar.key}"][data-term="${term.name}"]`));
}

// Also the way to reach segments too thin to tap: one button per term of each bar.
function legend(bars) {
  $("#mem-legend").replaceChildren(...bars.map((bar) => el("div", { class: "legend-row" },
    el("span", { class: "legend-bar", text: `${bar.label}:` }),
    ...bar.terms.filter((t) => t.value_bytes > 0).map((t) => el("button", {
      type: "button", class: "key", "data-bar": bar.key, "data-term": t.name,
      onclick: () => detail(bar.label, t, document.querySelector(`#mem-chart rect[data-bar="${bar.key}"][data-term="${t.name}"]`)),
    }, el("i", { style: `background:${TERM_COLORS[t.name]}` }), `${t.title} ${fmtBytes(t.value_bytes)}`)),
  )));
}

function detail(barLabel, term, rect) {
  picked = { bar: barLabel === "Training" ? "training" : "serving", name: term.name };
  for (const r of document.querySelectorAll("#mem-chart rect.selected")) r.classList.remove("selected");
  if (rect) rect.classList.add("selected");
  $("#mem-detail").replaceChildren(
    el("h4", {}, el("span", { class: "swatch", style: `background:${TERM_COLORS[term.name]}` }), `${barLabel} · ${term.title}: `,
      el("span", { id: "mem-detail-value", "data-bytes": term.value_bytes, text: fmtBytes(term.value_bytes) })),
    el("p", { text: term.what }),
    el("p", {}, el("b", { text: "Formula: " }), el("code", { text: term.formula })),
    el("p", { class: "note" }, el("b", { text: "Source: " }), term.source),
  );
}
