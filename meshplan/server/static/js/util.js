// Shared helpers: DOM and SVG building, number formatting (decimal units), API calls, errors.
// Formatting only converts units for display; every value comes from the API.

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

const SVG_NS = "http://www.w3.org/2000/svg";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
}

// The drawing width that keeps SVG text legible: the chart's own width, between 340 and `max` user units.
export function chartWidth(node, max = 760) {
  return Math.round(Math.max(340, Math.min(max, (node.clientWidth || max) - 14)));
}

// Redraw with the last data when the window is resized.
export function onResize(redraw) {
  window.addEventListener("resize", debounce(redraw, 150));
}

export function tooltip(node, text) {
  node.append(svg("title", { text }));
  return node;
}

// --- numbers -------------------------------------------------------------------------------------------------------

export function fmtBytes(bytes) {
  if (bytes === null || bytes === undefined || Number.isNaN(bytes)) return "–";
  const a = Math.abs(bytes);
  if (a >= 1e15) return `${fmtInt(bytes / 1e12)} TB`;
  if (a >= 1e12) return `${(bytes / 1e12).toFixed(a >= 1e13 ? 1 : 2)} TB`;
  if (a >= 1e9) return `${(bytes / 1e9).toLocaleString("en-US", { maximumFractionDigits: a >= 1e11 ? 0 : 1, minimumFractionDigits: a >= 1e11 ? 0 : 1 })} GB`;
  if (a >= 1e6) return `${(bytes / 1e6).toFixed(1)} MB`;
  if (a >= 1e3) return `${(bytes / 1e3).toFixed(1)} kB`;
  return `${fmtInt(bytes)} B`;
}

export function fmtGB(bytes, digits = 1) {
  return `${(bytes / 1e9).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits })} GB`;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  const a = Math.abs(s);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${(s * 1e6).toFixed(1)} µs`;
  if (a < 1) return `${(s * 1e3).toFixed(a < 1e-2 ? 2 : 1)} ms`;
  if (a < 100) return `${s.toFixed(2)} s`;
  return `${fmtInt(s)} s`;
}

// A GPU as people name it (H100 SXM 80 GB), from the catalog's display name; the catalog name if it has none.
export function gpuName(catalog, name) {
  const g = catalog && catalog.gpus.find((x) => x.name === name);
  return (g && g.display_name) || name;
}

// HBM as nvidia-smi shows it (GiB, 2^30 bytes), with the decimal bytes for a detail.
export const fmtGiB = (bytes) => `${(bytes / 2 ** 30).toLocaleString("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 })} GiB`;
export const bytesDetail = (bytes) => `${Math.round(bytes / 2 ** 20).toLocaleString("en-US")} MiB as nvidia-smi reports it; ${Math.round(bytes).toLocaleString("en-US")} bytes (${(bytes / 1e9).toFixed(1)} GB)`;

export const fmtPct = (x) => `${(100 * x).toFixed(1)}%`;
export const fmtInt = (n) => Math.round(n).toLocaleString("en-US");
// A tick or any plain number with thousands separators (1,000; 0.25 stays 0.25).
export const fmtNum = (x) => Number(x).toLocaleString("en-US", { maximumFractionDigits: 6 });
export const fmtRatio = (x) => `${x >= 10 ? x.toFixed(0) : x.toFixed(x >= 2 ? 1 : 2)}×`;

// Round tick steps for an axis from 0 to max: 1, 2 or 5 times a power of ten.
export function ticks(max, count = 5) {
  if (!(max > 0)) return [0];
  const raw = max / count;
  const p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
  const out = [];
  for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
  return out;
}

// --- API -----------------------------------------------------------------------------------------------------------

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined) q.set(k, String(v).trim());
  return q.toString();
}

export async function api(path, params = {}, options = {}) {
  const q = query(params);
  const response = await fetch(q ? `${path}?${q}` : path, options);
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    if (isAbort(err)) throw err; // superseded while the body was read: not an empty answer
    body = null;
  }
  // A request aborted after its body arrived is superseded too: its caller must not draw a stale (or null) answer.
  if (options.signal && options.signal.aborted) throw new DOMException("superseded", "AbortError");
  if (!response.ok) {
    const message = body && body.error ? body.error : `the server answered ${response.status}`;
    throw new ApiError(message, response.status);
  }
  return body;
}

// An engine's config file read by POST /api/config, as --from reads it; a refusal is an Error naming the file.
export async function readConfig(file) {
  const response = await fetch("/api/config", {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text: await file.text() }),
  });
  const body = await response.json().catch(() => ({ error: `the server answered ${response.status}` }));
  if (!response.ok) throw new Error(`${file.name}: ${body.error}`);
  return body;
}

// Calls where only the last one matters: an input change aborts the request still in flight.
export function latestOnly() {
  let controller = null;
  return async (path, params) => {
    if (controller) controller.abort();
    controller = new AbortController();
    return api(path, params, { signal: controller.signal });
  };
}

export const isAbort = (err) => err && err.name === "AbortError";

// Show an error under a view; `labels` renames the API's parameter names to the labels of the form's fields.
export function showError(node, err, labels = {}) {
  if (!err) {
    node.hidden = true;
    node.textContent = "";
    return;
  }
  let message = `${err.message || err}`;
  for (const [name, label] of Object.entries(labels)) {
    if (message.startsWith(`${name}:`)) message = `${label}:${message.slice(name.length + 1)}`;
  }
  node.hidden = false;
  node.textContent = err instanceof ApiError ? `The engine refused this input. ${message}` : message;
}

export function debounce(fn, ms = 30) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

// Call `fn` once at the next animation frame, however many times this is called before it.
export function nextFrame(fn) {
  let asked = false;
  return () => {
    if (asked) return;
    asked = true;
    requestAnimationFrame(() => { asked = false; fn(); });
  };
}

export function formValues(form) {
  const out = {};
  for (const field of form.elements) {
    if (!field.name) continue;
    out[field.name] = field.type === "checkbox" ? field.checked : field.value;
  }
  return out;
}

// Re-run `fn` whenever a field of `form` changes, once typing pauses for `ms` (0: at the next frame; a view whose
// requests abort the one in flight can ask at once). An event that leaves every value as it was asks nothing: the
// "change" a typed field fires when it loses focus (to a click on Export, say) must not redraw the answer it already
// shows, nor clear what that click reported. Submitting (Enter) always re-runs.
export function onFormChange(form, fn, ms = 30) {
  let asked = JSON.stringify(formValues(form));
  const changed = () => {
    const now = JSON.stringify(formValues(form));
    if (now === asked) return;
    asked = now;
    fn();
  };
  const later = ms ? debounce(changed, ms) : nextFrame(changed);
  form.addEventListener("input", later);
  form.addEventListener("change", later);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    asked = JSON.stringify(formValues(form));
    fn();
  });
}

// --- colors --------------------------------------------------------------------------------------------------------

// Fills that carry text: each leaves ink or white at 4.5:1 or more (red darkened from #e15759 for that).
export const PIECE_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#c8383b", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"];

export const TERM_COLORS = {
  weights_bytes: "#4e79a7",
  adapter_weights_bytes: "#76b7b2",
  gradients_bytes: "#f28e2b",
  master_weights_bytes: "#e15759",
  optimizer_moments_bytes: "#b07aa1",
  activations_bytes: "#59a14f",
  logits_bytes: "#edc948",
  activation_workspace_bytes: "#8cd17d",
  dequant_workspace_bytes: "#d37295",
  comm_buffers_bytes: "#ff9da7",
  framework_bytes: "#9c755f",
  runtime_reserve_bytes: "#9c755f",
  engine_headroom_bytes: "#bab0ac",
  fragmentation_bytes: "#bab0ac",
  kv_cache_bytes: "#17a2b8",
};

// --- never a stale number ------------------------------------------------------------------------------------------

// Mark a view's results while a request is pending ("busy") or after the last input was refused ("error"); null
// marks them current. aria-busy is set at once; the dimming and its label wait 150 ms, so that quick updates
// (most take 10-60 ms) neither flicker nor restyle the page on every keystroke.
const dimTimers = new WeakMap();
export function markResults(node, state) {
  if (!node) return;
  clearTimeout(dimTimers.get(node));
  node.setAttribute("aria-busy", state === "busy" ? "true" : "false");
  if (state === "busy") {
    dimTimers.set(node, setTimeout(() => { node.dataset.stale = "busy"; }, 150));
  } else if (state) {
    node.dataset.stale = state;
  } else {
    if (node.dataset.stale) delete node.dataset.stale;
    // after the caller has drawn the new answer
    requestAnimationFrame(() => node.dispatchEvent(new CustomEvent("results-current", { bubbles: true, detail: node })));
  }
}

// Run `request` with the results marked busy meanwhile; on success they are current, on a refusal they stay marked.
// An aborted request leaves the marks to the request that replaced it.
export async function tracked(node, request) {
  markResults(node, "busy");
  const mine = (node.dataset.generation = String(Number(node.dataset.generation || 0) + 1));
  try {
    const out = await request();
    // a later request for the same results is on its way: this answer is superseded, never drawn over that one
    if (node.dataset.generation !== mine) throw new DOMException("superseded", "AbortError");
    markResults(node, null);
    return out;
  } catch (err) {
    if (!isAbort(err)) markResults(node, "error");
    throw err;
  }
}

// --- phones, keyboards, eyes ---------------------------------------------------------------------------------------

// The text color (ink or white) with the higher contrast on a fill `#rrggbb` (WCAG relative luminance).
export function inkOn(hex) {
  const c = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255)
    .map((v) => (v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4));
  const lum = 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  const ink = 0.0173; // #1d2430
  return (lum + 0.05) / (ink + 0.05) >= 1.05 / (lum + 0.05) ? "#1d2430" : "#ffffff";
}

export const reducedMotion = () => window.matchMedia("(prefers-reduced-motion: reduce)").matches;

// Re-render `container` without losing the keyboard focus: the focused element is found again by `attr`.
export function keepFocus(container, attr, render) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.getAttribute(attr) : null;
  render();
  if (key !== null) {
    const again = Array.from(container.querySelectorAll(`[${attr}]`)).find((n) => n.getAttribute(attr) === key);
    if (again) again.focus({ preventScroll: true });
  }
}

// Enter and Space act as a click on an element that is not a native button (an SVG row, a table header).
export function pressable(node, action) {
  node.addEventListener("click", action);
  node.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      action(e);
    }
  });
  return node;
}
