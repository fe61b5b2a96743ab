// View 6: which strategies runs use, in three tiers; tap a tier for the reason.

import { $, api, el } from "./util.js";

let open = "universal";

export async function init() {
  try {
    const data = await api("/api/tiers");
    render(data.tiers);
  } catch (err) {
    $("#tiers").replaceChildren(el("p", { class: "error", role: "alert", text: `The tiers could not be loaded: ${err.message}` }));
  }
}

function render(tiers) {
  $("#tiers").replaceChildren(...tiers.map((t, i) => {
    const expanded = t.key === open;
    const head = el("button", {
      type: "button", class: expanded ? "tier-head open" : "tier-head", "data-tier": t.key, "aria-expanded": expanded ? "true" : "false",
      onclick: () => { open = expanded ? null : t.key; render(tiers); },
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
