// View 6: which strategies runs use, in three tiers; tap a tier for the reason.

import { extra, setExtra } from "./state.js";
import { $, api, el, keepFocus } from "./util.js";

const FIRST = "universal";
let open = FIRST;
let loaded = null;

export const PRIMARY = "tier";

const fromState = () => { const t = extra("tiers", "tier"); return t === "none" ? null : t || FIRST; };

export function restore() {
  open = fromState();
  if (loaded) render(loaded);
}

export async function init() {
  open = fromState();
  try {
    const data = await api("/api/tiers");
    loaded = data.tiers;
    render(data.tiers);
  } catch (err) {
    $("#tiers").replaceChildren(el("p", { class: "error", role: "alert", text: `The tiers could not be loaded: ${err.message}` }));
  }
}

function render(tiers) {
  keepFocus($("#tiers"), "data-tier", () => draw(tiers));
}

function draw(tiers) {
  $("#tiers").replaceChildren(...tiers.map((t, i) => {
    const expanded = t.key === open;
    const head = el("button", {
      type: "button", class: expanded ? "tier-head open" : "tier-head", "data-tier": t.key, "aria-expanded": expanded ? "true" : "false",
      onclick: () => {
        open = expanded ? null : t.key;
        setExtra("tiers", "tier", open === FIRST ? null : open ?? "none");
        render(tiers);
      },
    }, el("span", { class: "tier-rank", text: `${i + 1}` }), el("span", { class: "tier-title", text: t.title }),
      el("span", { class: "tier-names", text: t.names.join(" · ") }));
    const body = expanded
      ? el("div", { class: "tier-body", "data-tier-body": t.key },
          el("p", { text: t.reason }),
          el("ul", {}, ...t.detail.map((d) => el("li", { text: d }))),
          el("p", {}, "See them split 8 GPUs: ", ...t.strategies.map((k, j) => [j ? ", " : "", el("a", { href: `#strategies?${k}`, text: t.names[j] })]).flat()))
      : null;
    return el("div", { class: "tier" }, head, body);
  }));
}
