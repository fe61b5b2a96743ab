// View 3: a model's weights spread evenly over N GPUs: one bar per GPU against its HBM.

import { SERVING_ENGINES, cliCommand, cliModel, takeaway } from "./takeaway.js";
import { $, bytesDetail, chartWidth, el, fmtBytes, fmtInt, fmtNum, fmtPct, formValues, fmtGiB, gpuName, isAbort, latestOnly, onFormChange, onResize, showError, svg, ticks, tracked } from "./util.js";

const call = latestOnly();
const MAX_BARS = 64;
let last = null;
let ctx = null;

export function init(context) {
  ctx = context;
  const form = $("#w-form");
  // The slider and the box are one control: moving either sets the other.
  form.elements.gpus_range.addEventListener("input", () => { form.elements.gpus.value = form.elements.gpus_range.value; });
  form.elements.gpus.addEventListener("input", () => {
    const n = Number(form.elements.gpus.value);
    if (Number.isInteger(n) && n >= 1) form.elements.gpus_range.value = String(Math.min(n, MAX_BARS));
  });
  onFormChange(form, update);
  onResize(() => last && draw(last));
  update();
}

async function update() {
  const v = formValues($("#w-form"));
  try {
    const r = await tracked($("#w-results"), () => call("/api/fit", { model: v.model, gpu: v.gpu, gpus: v.gpus, dtype: v.dtype }));
    showError($("#w-error"), null);
    draw(r);
    takeaway($("#w-takeaway"), {
      id: "w", command: cliCommand("fit", [cliModel(v.model)], [["gpu", v.gpu], ["gpus", v.gpus], ["weights_dtype", v.dtype]]),
      json: r, filename: `meshplan-fit-${r.model}-${r.gpus}x${r.gpu}.json`, engines: SERVING_ENGINES,
      exportQuery: () => ({ model: v.model, gpu: v.gpu, gpus: v.gpus, dtype: v.dtype }),
    });
  } catch (err) {
    if (!isAbort(err)) showError($("#w-error"), err, { gpus: "GPU count" });
  }
}

function draw(r) {
  last = r;
  const gpu = gpuName(ctx && ctx.catalog, r.gpu);
  const over = r.free_bytes_per_gpu < 0;
  $("#w-summary").replaceChildren(
    `${r.model} is `, el("strong", { id: "w-total", "data-bytes": r.weights_bytes_total, text: fmtBytes(r.weights_bytes_total) }),
    ` of weights in ${r.dtype}. ${r.gpus === 1 ? `On one ${gpu}, they take` : `Split ${fmtInt(r.gpus)} ways, each ${gpu} holds`} `,
    el("strong", { id: "w-per-gpu", "data-bytes": r.weights_bytes_per_gpu_even_split, text: fmtBytes(r.weights_bytes_per_gpu_even_split) }),
    `, ${fmtPct(r.hbm_fraction_per_gpu)} of its `,
    el("span", { title: bytesDetail(r.hbm_bytes_per_gpu), text: `${fmtGiB(r.hbm_bytes_per_gpu)} (${fmtBytes(r.hbm_bytes_per_gpu)})` }),
    over ? ": over by " : ", leaving ",
    el("strong", { id: "w-free", class: over ? "bad" : null, "data-bytes": r.free_bytes_per_gpu, text: fmtBytes(Math.abs(r.free_bytes_per_gpu)) }),
    over ? " per GPU (" : " per GPU (",
    el("span", { id: "w-free-total", "data-bytes": r.free_bytes_total, text: fmtBytes(Math.abs(r.free_bytes_total)) }),
    over ? " in total): the weights alone do not fit." : " in total) for activations and the KV cache.",
  );
  $("#w-verdict").replaceChildren(
    el("strong", { id: "w-fits", class: r.fits ? "ok" : "bad", text: r.fits ? "Fits." : "Does not fit." }),
    ` The weights alone need at least `,
    el("strong", { id: "w-min-weights", text: r.min_gpus_for_weights === null ? "more GPUs than any split allows" : String(r.min_gpus_for_weights) }),
    ` × ${gpu}. Training with Adam in mixed precision (${r.training_state_bytes_per_param} bytes per parameter, ${fmtBytes(r.training_state_bytes_total)}, activations on top) `,
    "fits on at least ",
    el("strong", { id: "w-min-training", text: r.min_gpus_for_training === null ? "none of the fleets searched" : String(r.min_gpus_for_training) }),
    ` × ${gpu}, by the planner's own search.`,
  );
  $("#w-chart").replaceChildren(bars(r));
}

function bars(r) {
  const n = Math.min(r.gpus, MAX_BARS);
  const W = chartWidth($("#w-chart")), H = 250, L = 56, B = 40, T = 22;
  const max = Math.max(r.hbm_bytes_per_gpu, r.weights_bytes_per_gpu_even_split) * 1.02;
  const y = (b) => T + (H - T - B) * (1 - b / max);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "weights per GPU against HBM" });
  for (const t of ticks(max / 1e9)) {
    root.append(svg("line", { x1: L, x2: W - 8, y1: y(t * 1e9), y2: y(t * 1e9), class: "grid" }));
    root.append(svg("text", { x: L - 6, y: y(t * 1e9) + 4, class: "tick", "text-anchor": "end", text: fmtNum(t) }));
  }
  root.append(svg("text", { x: 14, y: (H - B) / 2, class: "axis-label", "text-anchor": "middle", transform: `rotate(-90 14 ${(H - B) / 2})`, text: "GB per GPU" }));
  const slot = (W - L - 8) / n;
  const bw = Math.max(Math.min(slot * 0.7, 60), 2);
  for (let i = 0; i < n; i++) {
    const x = L + i * slot + (slot - bw) / 2;
    const used = Math.min(r.weights_bytes_per_gpu_even_split, max);
    const free = r.free_bytes_per_gpu < 0 ? `over by ${fmtBytes(-r.free_bytes_per_gpu)}` : `${fmtBytes(r.free_bytes_per_gpu)} free`;
    root.append(svg("rect", { x, y: y(r.hbm_bytes_per_gpu), width: bw, height: y(0) - y(r.hbm_bytes_per_gpu), class: "hbm" }));
    root.append(svg("rect", {
      x, y: y(used), width: bw, height: y(0) - y(used), class: r.fits ? "weights" : "weights over", "data-gpu": i,
    }, svg("title", { text: `GPU ${i}: ${fmtBytes(r.weights_bytes_per_gpu_even_split)} of weights, ${free}` })));
    // the HBM's top drawn over the bar, so that a bar past it still shows where the HBM ends
    root.append(svg("line", { x1: x - 2, x2: x + bw + 2, y1: y(r.hbm_bytes_per_gpu), y2: y(r.hbm_bytes_per_gpu), class: "hbm-top", "data-gpu": i }));
    if (n <= Math.floor(W / 60)) root.append(svg("text", { x: x + bw / 2, y: H - B + 16, class: "tick", "text-anchor": "middle", text: `GPU ${i}` }));
  }
  const caption = r.gpus > MAX_BARS
    ? `first ${MAX_BARS} of ${fmtInt(r.gpus)} GPUs drawn · shaded, dark top: ${fmtGiB(r.hbm_bytes_per_gpu)} HBM each`
    : `${fmtInt(r.gpus)} × ${gpuName(ctx && ctx.catalog, r.gpu)} · shaded, dark top: ${fmtGiB(r.hbm_bytes_per_gpu)} HBM each · solid: weights`;
  root.append(svg("text", { x: (W + L) / 2, y: H - 6, class: "axis-label", "text-anchor": "middle", text: caption }));
  return root;
}
