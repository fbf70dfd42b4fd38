/* The runs page: the table of `mlbench status`, live, with filters, search, sorting, compare,
   cancel and delete. It loads the runs a page at a time, newest first (/api/runs), the next page
   when its end comes into view or "More runs" is pressed; the live stream sends the rows that
   change. The sort and the search are the page's state: every render (a live update included)
   applies them to the rows it has; a search the loaded rows cannot answer alone asks the server
   (which searches every run), and a sort or a filter loads every run first. */
"use strict";

(() => {
  const { el, fmt, api } = MB;
  MB.navigation("runs");
  const PAGE = 100;              // runs per request
  const rows = new Map();        // id -> row, of the runs loaded
  const selected = new Set();
  const tbody = document.querySelector("#runs tbody");
  const filters = [...document.querySelectorAll(".filters select")];
  const search = document.getElementById("search");
  const NO_NETWORK = "unshaped";
  // what each sortable column sorts by: numbers numerically, text in natural order; a missing
  // value (a run without a time to goal, a run not yet measured) comes last either way
  const SORT_KEYS = {
    id: (r) => r.id, name: (r) => r.name, task: (r) => r.task, framework: (r) => r.framework,
    workers: (r) => r.workers, state: (r) => r.state, division: (r) => r.division_text,
    network: (r) => r.network, epoch: (r) => r.epoch, metric: (r) => r.metric_value,
    throughput: (r) => r.throughput, tta: (r) => r.time_to_accuracy, created: (r) => r.created_at,
  };
  const SEARCHED = ["id", "name", "task", "optimizer", "state"];
  const sort = { key: "created", descending: true };  // newest first until a header is clicked

  // what is loaded: every run that holds the words `loaded.q` and was created after the
  // cursor `loaded.next` ("CREATED_AT:ID" of the last run loaded; null: all of them)
  const loaded = { q: "", next: null, complete: false, total: 0, matching: 0, generation: 0, request: null };
  const words = () => search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);

  /** The first page again (``reset``), or the next one; a reset makes older answers stale. */
  function loadPage(reset) {
    if (!reset && (loaded.complete || loaded.request)) return loaded.request || Promise.resolve();
    const generation = reset ? ++loaded.generation : loaded.generation;
    const q = reset ? words().join(" ") : loaded.q;
    const params = new URLSearchParams({ limit: PAGE });
    if (q) params.set("q", q);
    if (!reset && loaded.next) params.set("before", loaded.next);
    const request = api(`/api/runs?${params}`).then((page) => {
      if (generation !== loaded.generation) return;
      if (reset) rows.clear();
      for (const row of page.runs) rows.set(row.id, row);
      Object.assign(loaded, { q, next: page.next, complete: !page.next, total: page.total, matching: page.matching });
      showSources(page.sources);
      refreshFilters();
      render();
    }).catch((err) => { document.getElementById("shown").textContent = err.message; })
      .finally(() => { if (loaded.request === request) loaded.request = null; });
    loaded.request = request;
    return request;
  }

  /** Every run the search holds (a sort or a filter orders and picks among all of them). */
  async function loadAll() {
    while (!loaded.complete) {
      const generation = loaded.generation;
      await loadPage(false);
      if (generation !== loaded.generation) return;  // the search changed: its own load follows
    }
  }

  /** Whether a row the stream sends belongs with the loaded ones: it holds the search and is
   *  newer than the last run loaded (older ones come with their page). */
  function belongs(row) {
    if (!matchesSearch(row)) return false;
    if (loaded.complete) return true;
    const cut = loaded.next.lastIndexOf(":"), created = Number(loaded.next.slice(0, cut)), id = loaded.next.slice(cut + 1);
    return row.created_at > created || (row.created_at === created && row.id > id);
  }

  /** Whether the table shows every run in its default order, unfiltered: then pages suffice. */
  const needsAll = () => !(sort.key === "created" && sort.descending) || filters.some((s) => s.value);

  const valueOf = (row, key) => (key === "network" ? row.network || NO_NETWORK : row[key]);
  const missing = (v) => v === null || v === undefined || v === "";

  function compareRows(a, b) {
    const key = SORT_KEYS[sort.key], x = key(a), y = key(b);
    if (missing(x) || missing(y)) {
      if (missing(x) !== missing(y)) return missing(x) ? 1 : -1;
    } else {
      const order = typeof x === "number" && typeof y === "number" ? x - y
        : String(x).localeCompare(String(y), undefined, { numeric: true, sensitivity: "base" });
      if (order) return sort.descending ? -order : order;
    }
    return b.created_at - a.created_at || a.id.localeCompare(b.id);
  }

  function matchesSearch(row) {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const text = SEARCHED.map((key) => String(row[key] ?? "")).join(" ").toLowerCase();
    return words.every((word) => text.includes(word));
  }

  function refreshFilters() {
    for (const select of filters) {
      const key = select.dataset.key, current = select.value;
      const values = [...new Set([...rows.values()].map((r) => valueOf(r, key)))].sort();
      select.replaceChildren(el("option", { value: "" }, "all"), ...values.map((v) => el("option", { value: v }, v)));
      select.value = values.includes(current) ? current : "";
    }
  }

  function shown(row) {
    return filters.every((s) => !s.value || String(valueOf(row, s.dataset.key)) === s.value) && matchesSearch(row);
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
        ? fmt.dur(row.time_to_accuracy) : row.no_time_to_goal),
      el("td", { class: "muted", "data-col": "created" }, fmt.time(row.created_at)),
      el("td", { class: "actions" },
        active ? el("button", { class: "small cancel", onclick: () => cancel(row) }, "Cancel") : null, " ",
        el("button", { class: "small danger delete", onclick: () => remove(row) }, "Delete")),
    ];
  }

  function render(changed = new Set()) {
    const visible = [...rows.values()].filter(shown).sort(compareRows);
    tbody.replaceChildren(...visible.map((row) => el("tr", {
      "data-id": row.id, "data-state": row.state, class: changed.has(row.id) ? "flash" : null }, cells(row))));
    document.getElementById("empty").classList.toggle("hidden", loaded.total > 0);
    document.getElementById("no-match").classList.toggle("hidden", loaded.total === 0 || visible.length > 0);
    document.getElementById("shown").textContent = loaded.total ? `${visible.length} of ${loaded.total} runs shown` : "";
    const more = document.getElementById("more");
    more.classList.toggle("hidden", loaded.complete);
    more.textContent = `More runs (${Math.max(0, loaded.matching - rows.size)} not loaded)`;
    showSort();
    updateCompare();
  }

  function showSort() {
    for (const th of document.querySelectorAll("#runs th[data-sort]")) {
      const here = th.dataset.sort === sort.key;
      th.setAttribute("aria-sort", here ? (sort.descending ? "descending" : "ascending") : "none");
      th.querySelector(".arrow").textContent = here ? (sort.descending ? "\u25BC" : "\u25B2") : "";
    }
  }

  /** A header sorts by its column, ascending; clicking it again reverses the order. */
  for (const th of document.querySelectorAll("#runs th[data-sort]")) {
    const label = th.textContent;
    th.replaceChildren(el("button", { type: "button", class: "sort", title: `sort by ${label.toLowerCase()}`,
      onclick: () => {
        sort.descending = sort.key === th.dataset.sort ? !sort.descending : false;
        sort.key = th.dataset.sort;
        render();
        if (needsAll()) loadAll();
      } }, label, el("span", { class: "arrow", "aria-hidden": "true" })));
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
    const ended = await MB.cancelRun(row);
    if (ended && rows.has(row.id)) { rows.set(row.id, { ...rows.get(row.id), state: ended.state, reason: ended.reason }); render(); }
  }

  async function remove(row) {
    if (await MB.deleteRun(row) && rows.delete(row.id)) {
      selected.delete(row.id);
      loaded.total -= 1; loaded.matching -= 1;
      render();
    }
  }

  document.getElementById("compare").addEventListener("click", () => {
    location.href = `/compare?runs=${[...selected].join(",")}`;
  });
  document.getElementById("select-all").addEventListener("change", (e) => {
    for (const row of rows.values()) if (shown(row)) (e.target.checked ? selected.add(row.id) : selected.delete(row.id));
    render();
  });
  for (const select of filters) select.addEventListener("change", () => { render(); if (needsAll()) loadAll(); });
  // the loaded rows are filtered at once; the server is asked unless they hold every run
  let typing = null;
  search.addEventListener("input", () => {
    render();
    clearTimeout(typing);
    if (loaded.complete && !loaded.q) return;
    typing = setTimeout(() => { if (words().join(" ") !== loaded.q) loadPage(true).then(() => needsAll() && loadAll()); }, 250);
  });
  document.getElementById("more").addEventListener("click", () => loadPage(false));
  // the next page when the end of the table comes into view
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting) && !needsAll()) loadPage(false);
  }).observe(document.getElementById("more"));

  MB.stream({ runs: 1 }, {
    runs(message) {
      showSources(message.sources || []);
      if (message.reset) {  // (re)connected: what it missed is in the pages
        loadPage(true).then(() => needsAll() && loadAll());
        return;
      }
      const changed = new Set();
      for (const row of message.rows) {
        const known = rows.has(row.id);
        if (!known && !belongs(row)) continue;
        if (!known) loaded.matching += 1;
        changed.add(row.id);
        rows.set(row.id, row);
      }
      for (const id of message.removed || []) if (rows.delete(id)) loaded.matching -= 1;
      loaded.total = message.total;
      if (!words().length) loaded.matching = message.total;
      refreshFilters();
      render(changed);
    },
  });
})();
