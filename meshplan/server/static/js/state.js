// Every input of a view lives in the URL, as #view?name=value&...: a reload or a shared link restores it.
// Form fields are written when they differ from their defaults; a view's other choices (a tab, a sort) are
// "extras" it sets and reads by name. history.replaceState rewrites the address without a hashchange.

import { $$, debounce } from "./util.js";

const extras = {}; // view -> { name: value }
const written = {}; // view -> the query last written or applied

export function hashView() {
  return (location.hash || "#home").slice(1).split("?")[0];
}

export function hashParams() {
  const h = location.hash;
  const i = h.indexOf("?");
  return new URLSearchParams(i < 0 ? "" : h.slice(i + 1));
}

function fields(view) {
  return $$(`#view-${view} form`).flatMap((form) => Array.from(form.elements))
    .filter((f) => f.name && f.type !== "file" && f.type !== "submit" && f.type !== "button");
}

function defaultOf(field) {
  if (field.type === "checkbox") return field.defaultChecked;
  if (field.tagName === "SELECT") {
    if (field.dataset.default) return field.dataset.default;
    const opt = Array.from(field.options).find((o) => o.defaultSelected) || field.options[0];
    return opt ? opt.value : "";
  }
  return field.defaultValue;
}

const valueOf = (field) => (field.type === "checkbox" ? field.checked : field.value);

// The query that describes the view now: changed fields, then the view's extras.
export function currentQuery(view) {
  const q = new URLSearchParams();
  for (const f of fields(view)) {
    const v = valueOf(f);
    if (v !== defaultOf(f)) q.set(f.name, f.type === "checkbox" ? (v ? "1" : "0") : v);
  }
  for (const [k, v] of Object.entries(extras[view] || {})) if (v !== null && v !== undefined) q.set(k, String(v));
  return q.toString();
}

export function save(view) {
  if (hashView() !== view) return;
  const q = currentQuery(view);
  written[view] = q;
  history.replaceState(null, "", `#${view}${q ? `?${q}` : ""}`);
}

// Set every field from `params` (fields it leaves out go back to their defaults); `addOption` is asked for a
// select value the page does not offer yet (an uploaded model's id). Extras are kept for the view to read.
// A bare key (#strategies?cp, as older links have it) sets the view's `primary` extra.
export function apply(view, params, addOption, primary = null) {
  // A link that only names a choice (#strategies?cp from the tiers) keeps the inputs as they are.
  const onlyChoice = [...params].every(([, v]) => v === "");
  for (const f of onlyChoice ? [] : fields(view)) {
    const has = params.has(f.name);
    const want = has ? params.get(f.name) : defaultOf(f);
    if (f.type === "checkbox") {
      f.checked = has ? ["1", "true", "on", "yes"].includes(want) : want;
    } else if (f.tagName === "SELECT") {
      if (!Array.from(f.options).some((o) => o.value === want) && addOption) addOption(f, want);
      if (Array.from(f.options).some((o) => o.value === want)) f.value = want;
    } else {
      f.value = want;
    }
  }
  const mine = {};
  for (const [k, v] of params) {
    if (fields(view).some((f) => f.name === k)) continue;
    if (v === "" && primary) mine[primary] = k;
    else mine[k] = v;
  }
  extras[view] = mine;
  written[view] = currentQuery(view);
}

// Whether the address holds a query for `view` other than the one last written or applied.
export function changedFromOutside(view) {
  const q = hashParams().toString();
  return q !== "" && q !== (written[view] ?? "");
}

// Every extra of a view (inputs its form does not show, from the address).
export function extrasOf(view) {
  return { ...(extras[view] || {}) };
}

export function extra(view, name) {
  return (extras[view] || {})[name] ?? null;
}

export function setExtra(view, name, value) {
  extras[view] = { ...(extras[view] || {}), [name]: value };
  save(view);
}

// Keep the address current as the view's forms change.
// Written once typing pauses, off the path from a keystroke to the new numbers.
export function watch(view) {
  const later = debounce(() => save(view), 120);
  for (const form of $$(`#view-${view} form`)) {
    form.addEventListener("input", later);
    form.addEventListener("change", later);
  }
}
