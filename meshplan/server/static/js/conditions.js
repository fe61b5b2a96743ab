// The training stack and the run conditions (the schema's "conditions" group) in a view's form: a Stack select and a
// collapsible group of the conditions most runs set, built from /api/catalog (the choices, bounds and help of the
// CLI flags), so that the query, the address and the copied command all take them by the flag's name.

import { el } from "./util.js";

// The conditions offered, in this order (the overlaps change only the step time: the memory view sends them too,
// and the bill is the same).
export const SHOWN = [
  "framework", "grad_sync", "reshard_after_forward", "microbatch_group", "first_stage_layers", "last_stage_layers",
  "selective", "recompute_modules",
  "recompute_layers", "loss", "loss_parallel", "grad_dtype", "master_dtype", "moment_dtype", "runtime_reserve",
  "offload_layers", "doc_tokens", "routing_imbalance", "fp8_recipe", "fp8_all_gather", "overlap_dp", "overlap_param_gather", "overlap_tp", "overlap_tp_backward", "overlap_ep",
  "overlap_pp", "overlap_cp",
];
export const CONDITION_LABELS = {
  framework: "Activation tensors of", grad_sync: "Gradient sync every micro-batch", reshard_after_forward: "Reshard after forward",
  microbatch_group: "Micro-batch group (interleaved)", first_stage_layers: "Layers on the first stage",
  last_stage_layers: "Layers on the last stage", selective: "Selective recompute of", recompute_modules: "Recompute modules",
  loss: "Loss", loss_parallel: "Loss parallel over TP", grad_dtype: "Gradients", master_dtype: "Master weights",
  moment_dtype: "Optimizer moments", runtime_reserve: "Runtime reserve (bytes)", stack: "Stack",
  recompute_layers: "Full recompute on the first layers of each stage", routing_imbalance: "MoE routing imbalance",
  offload_layers: "Layers offloaded to host", doc_tokens: "Packed documents of (tokens)",
  overlap_dp: "Overlap gradient reduce", overlap_param_gather: "Overlap parameter gather", overlap_tp: "Overlap TP",
  overlap_tp_backward: "Overlap TP backward", fp8_recipe: "FP8 scaling", fp8_all_gather: "FP8 all-gather of weights",
  overlap_ep: "Overlap EP dispatch", overlap_pp: "Overlap PP sends", overlap_cp: "Overlap CP exchange",
};
const NAMES = ["stack", ...SHOWN];

// Fill every <div data-conditions> of the page (before the views read their address).
export function build(catalog) {
  const specs = Object.fromEntries((catalog.conditions || []).map((c) => [c.name, c]));
  for (const box of document.querySelectorAll("[data-conditions]")) {
    const stack = el("select", { name: "stack", "data-default": "" },
      el("option", { value: "", text: "default (megatron-core, or the engine's)" }),
      ...(catalog.stacks || []).map((s) => el("option", { value: s.name, text: s.name, title: s.description })));
    const fields = SHOWN.filter((name) => specs[name]).map((name) => field(specs[name]));
    box.replaceChildren(
      el("label", { title: specs.stack ? specs.stack.help : "" }, `${CONDITION_LABELS.stack} `, stack),
      el("details", { class: "more" },
        el("summary", { text: "Run conditions" }),
        el("div", { class: "more-body" }, ...fields)),
    );
  }
}

function field(spec) {
  const label = CONDITION_LABELS[spec.name] || spec.name;
  const help = `${spec.help}${spec.unit ? ` [${spec.unit}]` : ""}`;
  if (spec.choices.length) {
    return el("label", { title: help }, `${label} `, el("select", { name: spec.name, "data-default": "" },
      el("option", { value: "", text: "the stack's" }), ...spec.choices.map((c) => el("option", { value: c, text: c }))));
  }
  const bounds = spec.lo !== null && spec.hi !== null ? `, ${spec.lo} to ${spec.hi}` : "";
  return el("label", { title: `${help}${bounds}` }, `${label} `, el("input", {
    name: spec.name, value: "", placeholder: spec.type === "float" ? "the stack's (e.g. 1e9)" : "the stack's", inputmode: spec.type === "int" ? "numeric" : "decimal",
  }));
}

// The query parameters (and flags) the form sets: the unset ones are left to the stack, else the schema's default.
export function conditionParams(v) {
  return Object.fromEntries(NAMES.map((name) => [name, (v[name] ?? "").trim() || null]));
}

export function conditionFlags(v) {
  return Object.entries(conditionParams(v));
}

// What the report says it ran with: each condition, its value and where that came from (flag, stack or default).
export function conditionsList(report) {
  const entries = Object.entries(report.conditions || {});
  if (!entries.length) return el("p", { class: "note", id: "mem-conditions-empty", text: "No run conditions reported." });
  return el("details", { class: "conditions", id: "mem-conditions" },
    el("summary", { text: `Run conditions${report.stack ? ` (stack ${report.stack})` : " (no stack)"}` }),
    el("dl", { class: "facts" }, ...entries.flatMap(([name, c]) => [
      el("dt", { text: name }),
      el("dd", { "data-condition": name, "data-source": c.source }, el("code", { text: c.value === null ? "none" : String(c.value) }), ` (${c.source})`),
    ])));
}
