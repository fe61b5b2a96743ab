// View 8: serving: the serving planner's Pareto curve under latency targets, its chosen plan, and where a step goes.

import { SERVE_PLAN_ENGINES, cliCommand, planName, takeaway } from "./takeaway.js";
import { $, chartWidth, el, fmtInt, fmtNum, fmtSeconds, formValues, gpuName, isAbort, latestOnly, onFormChange, onResize, pressable, readConfig, showError, svg, ticks, tracked } from "./util.js";

const plan = latestOnly();
const serve = latestOnly();
const LABELS = { gpus: "GPUs", input_len: "Input tokens", output_len: "Output tokens", ttft_p99: "TTFT p99", tpot_p99: "TPOT" };
const PHASES = [
  ["weights_read_s", "weights read", "#4e79a7"],
  ["kv_read_s", "KV cache read", "#17a2b8"],
  ["compute_s", "compute", "#59a14f"],
  ["communication_s", "communication", "#f28e2b"],
  ["overhead_s", "overhead", "#bab0ac"],
  ["host_wait_s", "host wait (kernels launched op by op)", "#c8383b"],
];
let last = null;
let ctx = null;

export function init(context) {
  ctx = context;
  onFormChange($("#sv-form"), update);
  $("#sv-config").addEventListener("change", openConfig);
  onResize(() => last && curve(last));
  update();
}

// A serving launcher read by POST /api/config (as --from reads it): the fleet, model, engine, kernels and admission
// it sets become this page's address; the GPU kind, the lengths and the targets stay as the form has them, and the
// layout flags it also sets (TP, memory share, batch cap) are not this search's (serve-plan searches them).
async function openConfig(event) {
  const file = event.target.files[0];
  if (!file) return;
  try {
    const body = await readConfig(file);
    if (body.training) throw new Error(`${file.name} is a ${body.kind} training config: the Layout view plans it`);
    const form = $("#sv-form");
    const v = formValues(form);
    const q = { ...v, launch: "cudagraph", capacity_scheduler: "" }; // what the file leaves unset: the engine's own
    const models = new Set(Array.from(form.elements.model.options, (o) => o.value));
    const used = [];
    for (const [k, x] of Object.entries(body.query)) {
      if (!(k in q) || (k === "model" && !models.has(String(x)))) continue;
      q[k] = String(x);
      used.push(k);
    }
    const note = $("#sv-config-note");
    note.hidden = false;
    note.textContent = `Read ${file.name} (${body.kind}): ${used.length ? used.join(", ") : "nothing this search takes"} `
      + `set here; ${fmtInt(body.not_read.length)} keys not read (meshplan serve-plan --from ${file.name} lists them and `
      + "what the search does not take).";
    showError($("#sv-error"), null);
    location.hash = `#serving?${new URLSearchParams(Object.entries(q).filter(([, x]) => x !== "" && x !== null))}`;
  } catch (err) {
    showError($("#sv-error"), err);
  } finally {
    event.target.value = "";
  }
}

export function layoutText(l) {
  const parts = [`TP ${l.tp}`];
  if (l.pp > 1) parts.push(`PP ${l.pp}`);
  if (l.ep > 1) parts.push(`EP ${l.ep}`);
  if (l.dp_attention) parts.push("attention-DP");
  return `${parts.join(" · ")} · ${l.weights_dtype} weights, ${l.kv_dtype} KV`;
}

async function update() {
  const v = formValues($("#sv-form"));
  const params = {
    model: v.model, gpu: v.gpu, gpus: v.gpus, input_len: v.input_len, output_len: v.output_len,
    ttft_p99: v.ttft_p99 || null, tpot_p99: v.tpot_p99 || null, engine: v.engine, top: 5,
    launch: v.launch === "cudagraph" ? null : v.launch,
    capacity_scheduler: v.capacity_scheduler || null,
  };
  try {
    const r = await tracked($("#sv-results"), async () => {
      const answer = await plan("/api/serve-plan", params);
      showError($("#sv-error"), null);
      last = answer;
      summary(answer);
      curve(answer);
      const best = answer.best;
      takeaway($("#sv-takeaway"), {
        id: "sv", json: answer, filename: `meshplan-serve-plan-${answer.model}-${v.gpus}x${v.gpu}.json`,
        // the best plan exactly as `meshplan export ENGINE --from-plan` takes it: replicas, TP x PP, batch cap, dtypes
        engines: best ? SERVE_PLAN_ENGINES : [],
        exportBody: () => answer,
        exportName: () => planName(answer.model, best.gpus, answer.gpu,
          `tp${best.layout.tp}-pp${best.layout.pp}${best.layout.ep > 1 ? `-ep${best.layout.ep}` : ""}-dp${best.replicas}-seqs${best.batch_cap_per_replica}`),
        // --engine always written: the form always states one, and the CLI widens the band of an unstated engine
        command: cliCommand("serve-plan", [v.model], [["gpu", v.gpu], ["gpus", v.gpus], ["input_len", v.input_len],
          ["output_len", v.output_len], ["ttft_p99", v.ttft_p99], ["tpot_p99", v.tpot_p99], ["engine", v.engine], ["top", 5],
          ["launch", v.launch, "cudagraph"], ["capacity_scheduler", v.capacity_scheduler, ""]]),
      });
      await breakdown(answer, v);
      return answer;
    });
    last = r;
  } catch (err) {
    if (!isAbort(err)) showError($("#sv-error"), err, LABELS);
  }
}

function summary(r) {
  const b = r.best;
  if (!b) {
    $("#sv-summary").replaceChildren(`No layout of ${r.model} on ${fmtInt(r.gpus)} × ${gpuName(ctx && ctx.catalog, r.gpu)} meets the targets (${fmtInt(r.rejected.length)} rejected).`);
    return;
  }
  $("#sv-summary").replaceChildren(
    el("span", { id: "sv-fleet", text: `${r.model} on ${fmtInt(r.gpus)} × ${gpuName(ctx && ctx.catalog, r.gpu)}. ` }),
    "Best: ", el("strong", { id: "sv-best", text: `${b.replicas} × ${layoutText(b.layout)}` }),
    ` at ${fmtInt(b.batch_cap_per_replica)} sequences per replica: `,
    el("strong", { id: "sv-tps", "data-value": b.tokens_per_s_per_gpu, text: `${fmtInt(b.tokens_per_s_per_gpu)} tokens/s per GPU` }),
    `, ${b.tokens_per_s_per_user.toFixed(1)} tokens/s per user, TTFT p99 ${fmtSeconds(b.ttft_s_p99)}. `,
    `${fmtInt(r.layouts_meeting_targets)} of ${fmtInt(r.layouts_evaluated)} layouts meet the targets, searched in ${fmtSeconds(r.elapsed_s)}.`,
  );
}

// Tokens/s per user across, tokens/s per GPU up: the front no plan beats on both; the best plan ringed.
function curve(r) {
  const pts = r.pareto;
  if (!pts.length) { $("#sv-pareto").replaceChildren(el("p", { class: "note", text: "Nothing meets the targets: nothing to plot." })); return; }
  const W = chartWidth($("#sv-pareto")), H = 280, L = 64, B = 44, T = 14, R = 16;
  const maxX = Math.max(...pts.map((p) => p.tokens_per_s_per_user)) * 1.05;
  const maxY = Math.max(...pts.map((p) => p.tokens_per_s_per_gpu)) * 1.05;
  const x = (v) => L + (W - L - R) * (v / maxX);
  const y = (v) => T + (H - T - B) * (1 - v / maxY);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "group", "aria-label": "Pareto front: tokens/s per GPU against tokens/s per user; each point is a button" });
  for (const t of ticks(maxY)) {
    root.append(svg("line", { x1: L, x2: W - R, y1: y(t), y2: y(t), class: "grid" }));
    root.append(svg("text", { x: L - 6, y: y(t) + 4, class: "tick", "text-anchor": "end", text: fmtInt(t) }));
  }
  for (const t of ticks(maxX)) root.append(svg("text", { x: x(t), y: H - B + 16, class: "tick", "text-anchor": "middle", text: fmtNum(t) }));
  root.append(svg("text", { x: (W + L) / 2, y: H - 8, class: "axis-label", "text-anchor": "middle", text: "tokens/s per user" }));
  root.append(svg("text", { x: 14, y: (H - B) / 2, class: "axis-label", "text-anchor": "middle", transform: `rotate(-90 14 ${(H - B) / 2})`, text: "tokens/s per GPU" }));
  // every point is a button (Tab, then Enter or Space; or a click): it says what the point is below the plot
  pts.forEach((p, i) => {
    const words = `${layoutText(p.layout)}, ${fmtInt(p.batch_cap_per_replica)} sequences per replica: ${fmtInt(p.tokens_per_s_per_gpu)} tokens/s per GPU, ${p.tokens_per_s_per_user.toFixed(1)} tokens/s per user`;
    const g = svg("g", { class: "pt", tabindex: 0, role: "button", "aria-label": `front point ${i + 1}: ${words}`, "data-front": i },
      svg("circle", { cx: x(p.tokens_per_s_per_user), cy: y(p.tokens_per_s_per_gpu), r: 12, class: "hit" }),
      svg("circle", { cx: x(p.tokens_per_s_per_user), cy: y(p.tokens_per_s_per_gpu), r: 3.5, class: "pareto-pt" }),
      svg("title", { text: words }));
    root.append(pressable(g, () => {
      for (const n of document.querySelectorAll("#sv-pareto g.pt.selected")) n.classList.remove("selected");
      g.classList.add("selected");
      $("#sv-point").textContent = `Front point ${i + 1}: ${words}.`;
    }));
  });
  if (r.best) root.append(svg("circle", { id: "sv-best-pt", cx: x(r.best.tokens_per_s_per_user), cy: y(r.best.tokens_per_s_per_gpu), r: 7, class: "best-pt" }));
  $("#sv-pareto").replaceChildren(root, el("p", { class: "note", text: `${fmtInt(pts.length)} of ${fmtInt(r.pareto_points_total)} front points drawn; ringed: the best plan under the targets.` }),
    el("p", { id: "sv-point", role: "status" }));
}

// A figure's P10-P90 under load; an end the slower machine cannot keep up with is saturated (null).
function bandText([lo, hi]) {
  const end = (x) => (x === null ? "saturated" : fmtSeconds(x));
  return `${end(lo)} to ${end(hi)}`;
}

// The chosen plan served at its batch cap (a closed loop of that many users per replica): one step, by phase.
async function breakdown(r, v) {
  if (!r.best) { $("#sv-steps").replaceChildren(); return; }
  const b = r.best, l = b.layout;
  const s = await serve("/api/serve", {
    model: v.model, gpu: v.gpu, gpus: b.gpus, input_len: v.input_len, output_len: v.output_len, engine: v.engine,
    concurrency: b.batch_cap_per_replica * b.replicas, tp: l.tp, pp: l.pp, ep: l.ep, dp_attention: l.dp_attention,
    replicas: b.replicas, weights_dtype: l.weights_dtype, kv_dtype: l.kv_dtype, quant: l.quant,
    launch: r.launch === "cudagraph" ? null : r.launch,
    capacity_scheduler: r.capacity_scheduler,
  });
  const total = PHASES.reduce((acc, [k]) => acc + s.step_s[k], 0);
  const shown = PHASES.filter(([key]) => key !== "host_wait_s" || s.step_s[key] > 0); // the wait only where it is one
  const W = chartWidth($("#sv-steps")), H = 46;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "one decode step by phase" });
  let at = 0;
  for (const [key, label, color] of shown) {
    const w = (W - 2) * (s.step_s[key] / total);
    root.append(svg("rect", { x: 1 + at, y: 4, width: Math.max(w, 0), height: H - 8, fill: color, class: "phase", "data-phase": key, "data-value": s.step_s[key] },
      svg("title", { text: `${label}: ${fmtSeconds(s.step_s[key])}` })));
    at += w;
  }
  const keys = shown.map(([key, label, color]) => el("span", { class: "legend-row" }, el("i", { class: "swatch", style: `background:${color}` }), `${label} ${fmtSeconds(s.step_s[key])}`));
  $("#sv-steps").replaceChildren(
    el("p", { id: "sv-step", "data-value": total, text: `One engine step ${fmtSeconds(total)} at ${fmtInt(s.batch_per_replica)} sequences per replica, the steps that carry a prompt included.` }),
    el("p", { id: "sv-tpot", "data-value": s.tpot_s, text: `A request's TPOT ${fmtSeconds(s.tpot_s)} (p99 ${fmtSeconds(s.tpot_s_p99)}): the step that ran its own prompt counts in its TTFT (p99 ${fmtSeconds(s.ttft_s_p99)}), not in its intervals.` }),
    el("p", { id: "sv-band", class: "note", text: `P10-P90 of the p99s, from published serving measurements held out by source: TPOT ${bandText(s.load_band.tpot_s_p99)}, TTFT ${bandText(s.load_band.ttft_s_p99)}.` }),
    root, el("div", { class: "legend" }, ...keys),
  );
}
