// The explorer's shell: load the catalog, fill the shared selects, route #hash to a view.

import { $, $$, api, el } from "./util.js";
import * as memory from "./memory.js";
import * as strategies from "./strategies.js";
import * as weights from "./weights.js";
import * as tp from "./tp.js";
import * as recipes from "./recipes.js";
import * as tiers from "./tiers.js";
import * as planner from "./planner.js";
import * as serving from "./serving.js";

const VIEWS = { memory, strategies, weights, tp, recipes, tiers, planner, serving };
const started = new Set();
const ctx = { catalog: null, uploads: [] };

function fill(select, items, { value = (x) => x, label = (x) => x, selected } = {}) {
  const keep = select.value;
  select.replaceChildren(...items.map((x) => el("option", { value: value(x), text: label(x) })));
  const want = keep || selected || select.dataset.default;
  if (want && items.some((x) => value(x) === want)) select.value = want;
}

function fillSelects(catalog) {
  for (const s of $$("select[data-models]")) fill(s, catalog.models);
  for (const s of $$("select[data-catalog-models]")) fill(s, catalog.models);
  for (const s of $$("select[data-gpus]")) fill(s, catalog.gpus, { value: (g) => g.name, label: (g) => g.name });
  for (const s of $$("select[data-precisions]")) fill(s, catalog.precisions, { value: (p) => p.name, label: (p) => p.name });
  for (const s of $$("select[data-optimizers]")) fill(s, catalog.optimizers);
  for (const s of $$("select[data-recompute]")) fill(s, catalog.recompute);
  for (const s of $$("select[data-serving-dtypes]")) fill(s, catalog.serving_dtypes);
  for (const s of $$("select[data-kv-dtypes]")) fill(s, catalog.kv_dtypes);
}

// An uploaded config.json becomes a choice in every model select that takes uploads.
ctx.addUpload = (upload) => {
  ctx.uploads.push(upload);
  for (const s of $$("select[data-models]")) {
    if (!Array.from(s.options).some((o) => o.value === upload.id)) {
      s.append(el("option", { value: upload.id, text: `${upload.name} (uploaded)` }));
    }
  }
};

function route() {
  const name = (location.hash || "#home").slice(1).split("?")[0];
  const view = VIEWS[name] ? name : "home";
  for (const section of $$("section.view")) section.hidden = section.dataset.view !== view;
  for (const a of $$("#nav a")) a.classList.toggle("active", a.getAttribute("href") === `#${view}`);
  if (view !== "home" && !started.has(view)) {
    started.add(view);
    VIEWS[view].init(ctx);
  }
  if (view !== "home" && VIEWS[view].show) VIEWS[view].show(ctx);
  window.scrollTo(0, 0);
}

async function listEndpoints() {
  try {
    const schema = await api("/openapi.json");
    const items = [];
    for (const [path, methods] of Object.entries(schema.paths)) {
      for (const [method, op] of Object.entries(methods)) {
        items.push(el("li", {}, el("code", { text: `${method.toUpperCase()} ${path}` }), ` ${op.summary || ""}`));
      }
    }
    $("#api-list").replaceChildren(...items);
  } catch (err) {
    $("#api-list").replaceChildren(el("li", { text: `could not read the schema: ${err.message}` }));
  }
}

async function boot() {
  try {
    ctx.catalog = await api("/api/catalog");
  } catch (err) {
    $("#boot").textContent = `The catalog could not be loaded: ${err.message}`;
    $("#boot").classList.add("error");
    return;
  }
  $("#boot").remove();
  fillSelects(ctx.catalog);
  window.addEventListener("hashchange", route);
  route();
  listEndpoints();
  document.body.dataset.ready = "1";
}

boot();
