/* The runs page: the table of `mlbench status`, live, with filters, compare, cancel and delete. */
"use strict";

(() => {
  const { el, fmt, api } = MB;
  MB.navigation("runs");
  const rows = new Map();        // id -> row
  const selected = new Set();
  const tbody = document.querySelector("#runs tbody");
  const filters = [...document.querySelectorAll(".filters select")];
  const NO_NETWORK = "unshaped";

  const valueOf = (row, key) => (key === "network" ? row.network || NO_NETWORK : row[key]);

  function refreshFilters() {
    for (const select of filters) {
      const key = select.dataset.key, current = select.value;
      const values = [...new Set([...rows.values()].map((r) => valueOf(r, key)))].sort();
      select.replaceChildren(el("option", { value: "" }, "all"), ...values.map((v) => el("option", { value: v }, v)));
      select.value = values.includes(current) ? current : "";
    }
  }

  function shown(row) {
    return filters.every((s) => !s.value || String(valueOf(row, s.dataset.key)) === s.value);
  }

  function cells(row) {
    const active = row.state === "pending" || row.state === "running";
    return [
      el("td", {}, el("input", { type: "checkbox", class: "pick", checked: selected.has(row.id),
        onchange: (e) => { e.target.checked ? selected.add(row.id) : selected.delete(row.id); updateCompare(); } })),
      el("td", { class: "mono" }, el("a", { href: `/runs/${row.id}` }, row.id)),
      el("td", {}, el("a", { href: `/runs/${row.id}` }, row.name)),
      el("td", { "data-col": "task" }, row.task),
      el("td", { "data-col": "framework" }, row.framework),
      el("td", { class: "num" }, row.workers_text),
      el("td", { "data-col": "state", title: row.reason || "" }, MB.badge(row.state)),
      el("td", {}, row.division_text),
      el("td", { class: "muted" }, row.network || "-"),
      el("td", { class: "num", "data-col": "epoch" }, fmt.num(row.epoch)),
      el("td", { class: "num", "data-col": "metric" }, row.metric_text),
      el("td", { class: "num", "data-col": "throughput" }, row.throughput ? fmt.rate(row.throughput, row.throughput_unit) : "-"),
      // as `mlbench status` says it: a missed goal is not a run without one
      el("td", { class: "num", "data-col": "tta" }, row.time_to_accuracy !== null && row.time_to_accuracy !== undefined
        ? fmt.dur(row.time_to_accuracy) : active ? "-" : row.goal === null || row.goal === undefined ? "no goal" : "not reached"),
      el("td", { class: "muted" }, fmt.time(row.created_at)),
      el("td", {},
        active ? el("button", { class: "small cancel", onclick: () => cancel(row) }, "Cancel") : null, " ",
        el("button", { class: "small danger delete", onclick: () => remove(row) }, "Delete")),
    ];
  }

  function render(changed = new Set()) {
    const ordered = [...rows.values()].sort((a, b) => b.created_at - a.created_at);
    const visible = ordered.filter(shown);
    tbody.replaceChildren(...visible.map((row) => el("tr", {
      "data-id": row.id, "data-state": row.state, class: changed.has(row.id) ? "flash" : null }, cells(row))));
    document.getElementById("empty").classList.toggle("hidden", rows.size > 0);
    updateCompare();
  }

  function updateCompare() {
    for (const id of [...selected]) if (!rows.has(id)) selected.delete(id);
    const button = document.getElementById("compare");
    button.disabled = selected.size === 0;
    button.textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
  }

  function showSources(sources) {
    const box = document.getElementById("sources");
    const problems = sources.filter((s) => s.error);
    const names = sources.map((s) => s.label).join(" and ");
    box.replaceChildren(
      ...(sources.length > 1 ? [el("p", { class: "muted", style: "margin: 0 0 10px" }, `Runs of ${names}.`)] : []),
      ...problems.map((s) => el("div", { class: "notice error" }, `${s.label}: ${s.error}`)));
  }

  async function cancel(row) {
    try { await api(`/api/runs/${row.id}/cancel`, { method: "POST" }); }
    catch (err) { alert(err.message); }
  }

  async function remove(row) {
    const what = row.state === "running" || row.state === "pending" ? " It is still running: it will be cancelled first." : "";
    if (!(await MB.confirmDialog(`Delete run ${row.id} (${row.name}) and everything it recorded?${what}`))) return;
    try {
      await api(`/api/runs/${row.id}`, { method: "DELETE" });
      rows.delete(row.id); selected.delete(row.id); render();
    } catch (err) { alert(err.message); }
  }

  document.getElementById("compare").addEventListener("click", () => {
    location.href = `/compare?runs=${[...selected].join(",")}`;
  });
  document.getElementById("select-all").addEventListener("change", (e) => {
    for (const row of rows.values()) if (shown(row)) (e.target.checked ? selected.add(row.id) : selected.delete(row.id));
    render();
  });
  for (const select of filters) select.addEventListener("change", () => render());

  MB.stream({ runs: 1 }, {
    runs(message) {
      const changed = new Set();
      if (message.reset) rows.clear();
      for (const row of message.rows) { if (!message.reset) changed.add(row.id); rows.set(row.id, row); }
      for (const id of message.removed || []) rows.delete(id);
      showSources(message.sources || []);
      refreshFilters();
      render(changed);
    },
  });
})();
