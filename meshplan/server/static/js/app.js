// The explorer's shell: load the catalog, fill the shared selects, route #hash to a view.

import { $, $$, api, debounce, el } from "./util.js";
import * as memory from "./memory.js";
import * as strategies from "./strategies.js";
import * as weights from "./weights.js";
import * as tp from "./tp.js";
import * as recipes from "./recipes.js";
import * as tiers from "./tiers.js";
import * as planner from "./planner.js";
import * as serving from "./serving.js";
import * as state from "./state.js";
import * as conditions from "./conditions.js";
import * as layout from "./layout.js";

const VIEWS = { memory, strategies, weights, tp, recipes, tiers, planner, serving, layout };
const started = new Set();
const ctx = { catalog: null, uploads: [] };

function fill(select, items, { value = (x) => x, label = (x) => x, selected } = {}) {
  const keep = select.value;
  const blank = select.dataset.blank !== undefined ? [el("option", { value: "", text: select.dataset.blank })] : [];
  select.replaceChildren(...blank, ...items.map((x) => el("option", { value: value(x), text: label(x) })));
  const want = keep || selected || select.dataset.default;
  if (want && items.some((x) => value(x) === want)) select.value = want;
}

function fillSelects(catalog) {
  for (const s of $$("select[data-models]")) fill(s, catalog.models);
  for (const s of $$("select[data-catalog-models]")) fill(s, catalog.models);
  for (const s of $$("select[data-gpus]")) fill(s, catalog.gpus, { value: (g) => g.name, label: (g) => g.display_name || g.name });
  for (const s of $$("select[data-precisions]")) fill(s, catalog.precisions, { value: (p) => p.name, label: (p) => p.name });
  for (const s of $$("select[data-optimizers]")) fill(s, catalog.optimizers);
  for (const s of $$("select[data-recompute]")) fill(s, catalog.recompute);
  for (const s of $$("select[data-serving-dtypes]")) fill(s, catalog.serving_dtypes);
  for (const s of $$("select[data-kv-dtypes]")) fill(s, catalog.kv_dtypes);
  conditions.build(catalog);
  const links = [{ name: "", label: "the GPU's default" }, ...catalog.links.map((l) => ({ name: l.name, label: l.name }))];
  for (const s of $$("select[data-links]")) fill(s, links, { value: (l) => l.name, label: (l) => l.label });
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

// A select asked for a value it does not offer: an uploaded model's id from a shared link (the server says if it
// no longer holds it).
function addOption(select, value) {
  if (select.name === "model" && value.startsWith("upload:")) ctx.addUpload({ id: value, name: value });
}

function route() {
  const name = state.hashView();
  const view = VIEWS[name] ? name : "home";
  for (const section of $$("section.view")) section.hidden = section.dataset.view !== view;
  for (const a of $$("#nav a")) {
    const here = a.getAttribute("href") === `#${view}`;
    a.classList.toggle("active", here);
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (view !== "home") {
    const mod = VIEWS[view];
    if (!started.has(view)) {
      state.apply(view, state.hashParams(), addOption, mod.PRIMARY);
      started.add(view);
      state.watch(view);
      mod.init(ctx);
      state.save(view);
    } else if (state.changedFromOutside(view)) {
      // A pasted or edited address: set the inputs from it and recompute.
      state.apply(view, state.hashParams(), addOption, mod.PRIMARY);
      if (mod.restore) mod.restore(ctx);
      else for (const form of $$(`#view-${view} form`)) form.dispatchEvent(new Event("change"));
      state.save(view);
    } else {
      state.save(view); // back from another view: the address shows this view's inputs again
    }
    if (mod.show) mod.show(ctx);
  }
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

// Regions wider than the screen (tables, fixed-size charts, commands) scroll sideways: they take the keyboard
// focus (arrow keys scroll them), say so to screen readers, and show a cue until scrolled to their end.
function scrollCues() {
  for (const node of $$(".table-wrap, .chart, .cli-row, .nest")) {
    const scrolls = node.scrollWidth > node.clientWidth + 2;
    node.classList.toggle("scrolls", scrolls);
    node.classList.toggle("at-end", scrolls && node.scrollLeft + node.clientWidth >= node.scrollWidth - 2);
    if (scrolls && !node.hasAttribute("tabindex")) {
      node.setAttribute("tabindex", "0");
      node.setAttribute("role", "region");
      node.setAttribute("aria-label", `${node.getAttribute("data-what") || "wide content"}, scrolls sideways`);
      node.addEventListener("scroll", () => node.classList.toggle("at-end", node.scrollLeft + node.clientWidth >= node.scrollWidth - 2));
    } else if (!scrolls && node.getAttribute("role") === "region") {
      node.removeAttribute("tabindex");
      node.removeAttribute("role");
      node.removeAttribute("aria-label");
    }
  }
}

// Tabs answer the arrow keys (a roving tabindex: only the selected tab is in the Tab order; Left/Right, Home and End
// move to another tab and select it).
function rovingTabs() {
  for (const list of $$("[role=tablist]")) {
    const sync = () => { for (const t of $$("[role=tab]", list)) t.tabIndex = t.getAttribute("aria-selected") === "true" ? 0 : -1; };
    new MutationObserver(sync).observe(list, { childList: true, subtree: true, attributes: true, attributeFilter: ["aria-selected"] });
    list.addEventListener("keydown", (e) => {
      const tabs = $$("[role=tab]", list);
      const at = tabs.indexOf(document.activeElement);
      if (at < 0) return;
      const to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      const tab = tabs[(to + tabs.length) % tabs.length];
      const key = tab.dataset.key;
      tab.focus();
      tab.click(); // the view redraws its tabs and keeps the focus on the tab with this key
      const again = $$("[role=tab]", list).find((t) => t.dataset.key === key);
      if (again && document.activeElement !== again) again.focus();
    });
  }
}

// The skip link moves the focus to the view shown (the address keeps naming the view).
function skipLink() {
  $("#skip").addEventListener("click", (e) => {
    e.preventDefault();
    const view = $("section.view:not([hidden])");
    const target = (view && view.querySelector("h1")) || $("#main-content");
    if (!target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
    target.focus();
  });
}

// On a phone the inputs fill the screen: after a change, the view's first result (its headline) also shows in a
// bar at the bottom until the result itself is on screen; tapping the bar scrolls to it.
function peek() {
  const bar = el("button", { type: "button", id: "peek", class: "peek", hidden: true });
  document.body.append(bar);
  const narrow = window.matchMedia("(max-width: 720px)");
  let target = null;
  bar.addEventListener("click", () => { if (target) target.scrollIntoView({ block: "start" }); bar.hidden = true; });
  document.addEventListener("results-current", (e) => {
    const first = e.detail.querySelector(".headline, .chips");
    if (!narrow.matches || !first || !first.textContent.trim()) return;
    // the first number of the headline is what must be on screen
    const box = (first.querySelector("strong") || first).getBoundingClientRect();
    if (box.top >= 0 && box.bottom <= window.innerHeight) { bar.hidden = true; return; }
    target = first;
    bar.replaceChildren(el("span", { class: "peek-text", text: `${first.textContent.trim().slice(0, 220)} ↓` }));
    bar.hidden = false;
    // never over the field being edited: the bar goes to the other half of the screen, and the field is scrolled
    // clear of it if it still overlaps
    const field = document.activeElement && document.activeElement.closest("form") ? document.activeElement : null;
    if (field) {
      const f = field.getBoundingClientRect();
      bar.classList.toggle("at-top", f.top + f.height / 2 > window.innerHeight / 2);
      const b = bar.getBoundingClientRect();
      if (f.bottom > b.top && f.top < b.bottom) {
        window.scrollBy(0, bar.classList.contains("at-top") ? f.top - b.bottom - 8 : f.bottom - b.top + 8);
      }
    } else {
      bar.classList.remove("at-top");
    }
  });
  window.addEventListener("scroll", debounce(() => {
    if (!target || bar.hidden) return;
    const box = (target.querySelector("strong") || target).getBoundingClientRect();
    if (box.top >= 0 && box.bottom <= window.innerHeight - bar.offsetHeight) bar.hidden = true;
  }, 60), { passive: true });
  window.addEventListener("hashchange", () => { bar.hidden = true; });
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
  new MutationObserver(debounce(scrollCues, 60)).observe($("main"), { childList: true, subtree: true });
  window.addEventListener("resize", debounce(scrollCues, 150));
  peek();
  rovingTabs();
  skipLink();
  fillSelects(ctx.catalog);
  window.addEventListener("hashchange", route);
  route();
  listEndpoints();
  document.body.dataset.ready = "1";
}

boot();
