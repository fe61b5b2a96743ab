// Plans you can take away: under every bill and plan, the equivalent `meshplan` command, the answer as a JSON
// file, and the layout as an engine's configuration (GET /api/export, the CLI's `meshplan export`).

import { api, el } from "./util.js";

export const TRAINING_ENGINES = ["torchtitan", "megatron", "deepspeed"];
export const SERVING_ENGINES = ["vllm", "sglang"];
export const SERVE_PLAN_ENGINES = ["vllm", "sglang", "trtllm"];
const ENGINE_NAMES = { torchtitan: "torchtitan", megatron: "Megatron-LM", deepspeed: "DeepSpeed", vllm: "vLLM", sglang: "SGLang", trtllm: "TensorRT-LLM" };

const SAFE = /^[A-Za-z0-9._,:=/@+-]+$/;
const quote = (v) => (SAFE.test(v) ? v : `'${v.replaceAll("'", "'\\''")}'`);

// `meshplan SUB POSITIONAL --flag value ...`: flags are [name, value, default]; a value equal to its default, empty,
// null or false is left out, true is a bare flag.
export function cliCommand(sub, positional, flags, json = true) {
  const parts = ["meshplan", sub, ...positional.map((p) => quote(String(p)))];
  for (const [name, value, dflt] of flags) {
    if (value === null || value === undefined || value === false || value === "") continue;
    if (dflt !== undefined && String(value) === String(dflt)) continue;
    parts.push(`--${name.replaceAll("_", "-")}`);
    if (value !== true) parts.push(quote(String(value).trim()));
  }
  if (json) parts.push("--json");
  return parts.join(" ");
}

// The model as the CLI takes it: a catalog name, or the path of the uploaded config.json.
export const cliModel = (model) => (String(model).startsWith("upload:") ? "path/to/config.json" : model);

// A layout from a report as the query of /api/export (and of /api/memory).
export function layoutQuery(l) {
  return {
    tp: l.tp, pp: l.pp, vpp: l.vpp, cp: l.cp, ep: l.ep, dp_shard: l.dp_shard, zero: l.zero, sp: l.sp ? "true" : "false",
    recompute: l.recompute, schedule: l.schedule, cp_kind: String(l.cp_kind).replace("_", "-"), micro_batch: l.micro_batch,
  };
}

function download(name, data) {
  const url = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: "application/json" }));
  const a = el("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function copy(text, code) {
  try {
    await navigator.clipboard.writeText(text);
    return "Command copied.";
  } catch {
    // No clipboard permission: select the text so that Ctrl-C (or a long press) copies it.
    const range = document.createRange();
    range.selectNodeContents(code);
    const sel = getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    return "The command is selected: copy it with Ctrl-C or a long press.";
  }
}

const chosen = {}; // bar id -> the engine last picked
const slug = (s) => String(s).replace(/[^A-Za-z0-9._-]+/g, "-");

// A training layout's identity for file names: tp8-pp2-dp4 (and cp, ep, virtual stages, ZeRO where used).
export function layoutSlug(l, gpus) {
  const dp = Math.max(1, Math.round(Number(gpus) / ((l.tp || 1) * (l.pp || 1) * (l.cp || 1))));
  const parts = [`tp${l.tp || 1}`, `pp${l.pp || 1}`];
  if (Number(l.vpp) > 1) parts.push(`vpp${l.vpp}`);
  if (Number(l.cp) > 1) parts.push(`cp${l.cp}`);
  if (Number(l.ep) > 1) parts.push(`ep${l.ep}`);
  parts.push(`dp${dp}`);
  if (Number(l.zero) > 0) parts.push(`zero${l.zero}`);
  return parts.join("-");
}

// model_GPUSxgpu_layout: the name every file exported from one plan starts with (llama-3.1-70b_64xh100-sxm_tp8-pp2-dp4).
export const planName = (model, gpus, gpu, layout) => slug(`${String(model).replace(/^upload:/, "uploaded-")}_${gpus}x${gpu}_${layout}`);

// Draw the bar into `node`. `o`: { id, command, json, filename, engines, exportQuery(engine), before: [controls],
// exportName(engine): the plan's identity for the exported file's name, exportBody(): a serve-plan answer posted to
// /api/export-plan (the CLI's `export ENGINE --from-plan`) instead of the GET query }.
export function takeaway(node, o) {
  const status = el("span", { class: "note", id: `${o.id}-status`, role: "status" });
  const code = el("code", { class: "cli", id: `${o.id}-command`, text: o.command });
  const items = [
    el("div", { class: "cli-row" }, code),
    el("button", { type: "button", class: "small", id: `${o.id}-copy`, onclick: async () => { status.textContent = await copy(o.command, code); } }, "Copy command"),
    el("button", { type: "button", class: "small", id: `${o.id}-json`, onclick: () => { download(o.filename, o.json); status.textContent = `Saved ${o.filename}.`; } }, "Download JSON"),
  ];
  const files = el("div", { class: "export-files", id: `${o.id}-files` });
  if (o.engines && o.engines.length) {
    const engine = el("select", { id: `${o.id}-engine`, "aria-label": "engine to export to", onchange: () => { chosen[o.id] = engine.value; } },
      ...o.engines.map((e) => el("option", { value: e, text: ENGINE_NAMES[e] || e })));
    if (o.engines.includes(chosen[o.id])) engine.value = chosen[o.id]; // a new answer keeps the engine picked
    const run = async (force = false) => {
      const name = engine.value;
      status.textContent = `Asking for the ${ENGINE_NAMES[name]} configuration…`;
      try {
        const result = o.exportBody
          ? await api(`/api/export-plan?to=${encodeURIComponent(name)}`, {}, {
            method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(o.exportBody()) })
          : await api("/api/export", { to: name, ...o.exportQuery(name), force: force ? "true" : null });
        const stem = o.exportName ? o.exportName(name) : `meshplan-${slug(o.filename.replace(/\.json$/, ""))}`;
        const file = `${stem}_${name}.json`;
        download(file, result);
        status.textContent = `Saved ${file}: ${Object.keys(result.files).join(", ")} and the launch command.`;
        files.replaceChildren(el("details", { open: force }, el("summary", { text: `${ENGINE_NAMES[name]}: ${result.command}` }),
          ...result.notes.map((n) => el("p", { class: n.startsWith("warning:") ? "note warn" : "note", text: n })),
          ...Object.entries(result.files).map(([f, text]) => el("div", {}, el("b", { text: `${stem}_${f}` }), el("pre", { text })))));
      } catch (err) {
        // A layout billed over HBM is refused unless forced: say so, and offer to export it anyway.
        if (/force=true/.test(err.message) && !force) {
          status.replaceChildren(el("strong", { class: "bad", id: `${o.id}-over`, text: "Does not fit: " }),
            `${err.message.replace(/; change the layout.*$/, "")}. `,
            el("button", { type: "button", class: "small", id: `${o.id}-force`, onclick: () => run(true) }, "Export anyway"));
        } else {
          status.textContent = `${ENGINE_NAMES[name]} cannot take this layout: ${err.message}`;
        }
        files.replaceChildren();
      }
    };
    items.push(el("span", { class: "export" }, ...(o.before || []), engine, el("button", { type: "button", class: "small", id: `${o.id}-export`, onclick: () => run(false) }, "Export")));
  }
  node.replaceChildren(el("div", { class: "takeaway-bar" }, ...items, status), files);
}
