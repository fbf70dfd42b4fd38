/* Compare: the table of `mlbench compare` and the four figures of `mlbench charts`, interactive. */
"use strict";

(() => {
  const { el, fmt, api, COLOURS } = MB;
  MB.navigation("compare");
  const form = document.getElementById("selection");
  const params = new URLSearchParams(location.search);
  for (const input of form.querySelectorAll("input")) input.value = params.get(input.name) || "";

  const axis = (label, values, size) => ({ label, stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" },
    ...(values ? { values } : {}), ...(size ? { size } : {}) });
  const bars = (align) => uPlot.paths.bars({ size: [0.35, 60], align });
  const show = (v, f) => (v === null || v === undefined ? "-" : f(v));
  const usd = (v) => (v === 0 ? "$0" : Math.abs(v) < 0.01 ? `$${v.toExponential(1)}` : `$${v.toFixed(2)}`);
  const workerLabel = (k) => `${k} worker${k > 1 ? "s" : ""}`;
  // the PNG charts' colours and line styles (mlbench.results.charts): a family's colour is
  // COLOURS[its index]; lines that share a colour differ in style
  const colour = (i) => COLOURS[i % COLOURS.length];
  const STYLES = [undefined, [6, 4], [2, 3], [8, 3, 2, 3]];
  const charts = {};
  /** One chart per container, kept across reloads of the comparison. */
  function chart(id, make, emptyText) {
    const c = charts[id] || (charts[id] = new MB.Chart(document.getElementById(id), make, emptyText));
    c.make = make;
    return c;
  }

  function tables(doc) {
    const out = [];
    for (const family of doc.families) {
      out.push(el("h3", { class: "family" }, family.heading));
      out.push(el("div", { style: "overflow-x: auto" }, el("table", { class: "data compare", "data-metric": family.metric },
        el("thead", {}, el("tr", {}, doc.headers.map((h, i) => el("th", { class: i ? "num" : null }, h)))),
        el("tbody", {}, family.groups.map((g) => el("tr", { "data-workers": g.workers },
          g.row.map((cell, i) => el("td", { class: i ? "num" : null, "data-col": doc.headers[i] }, cell))))))));
    }
    if (doc.sweep_table) {
      const t = doc.sweep_table;
      out.push(el("h3", {}, "By message size (median of the repeats)"));
      out.push(el("div", { style: "overflow-x: auto" }, el("table", { class: "data compare", id: "sweep-table" },
        el("thead", {}, el("tr", {}, t.headers.map((h, i) => el("th", { class: i ? "num" : null }, h)))),
        el("tbody", {}, t.rows.map((row) => el("tr", {}, row.map((cell, i) => el("td", { class: i ? "num" : null }, cell))))))));
    }
    if (doc.bandwidth_table) {
      const t = doc.bandwidth_table;
      out.push(el("h3", {}, "By bandwidth (median of the repeats; bytes each worker sent per step)"));
      out.push(el("div", { style: "overflow-x: auto" }, el("table", { class: "data compare", id: "bandwidth-table" },
        el("thead", {}, el("tr", {}, t.headers.map((h, i) => el("th", { class: i ? "num" : null }, h)))),
        el("tbody", {}, t.rows.map((row) => el("tr", {}, row.map((cell, i) => el("td", { class: i ? "num" : null, "data-col": t.headers[i] }, cell))))))));
    }
    document.getElementById("tables").replaceChildren(...out);
    const differences = document.getElementById("differences");
    differences.replaceChildren(...doc.differences.map((line) => el("p", { style: "margin: 0 0 8px" }, line)));
    differences.classList.toggle("hidden", !doc.differences.length);
    document.getElementById("notes").replaceChildren(...doc.notes.map((n) => el("p", { style: "margin: 8px 0 0" }, n)));
  }

  /** The configuration diff: a row per family (its colour, as in every figure, and its runs), a
   *  column per fingerprint key the families differ in; hidden when they are one configuration. */
  function configDiff(doc) {
    const card = document.getElementById("config-diff-card");
    const diff = doc.config_diff || [];
    card.classList.toggle("hidden", !diff.length);
    const table = document.getElementById("config-diff");
    if (!diff.length) { table.replaceChildren(); return; }
    table.replaceChildren(
      el("thead", {}, el("tr", {}, el("th", {}, "family (runs)"), diff.map((d) => el("th", {}, d.key)))),
      el("tbody", {}, doc.families.map((family, i) => el("tr", { "data-family": family.label },
        el("td", { class: "family", title: family.heading },
          el("span", { class: "swatch", style: `background: ${colour(i)}`, "aria-hidden": "true" }),
          family.groups.flatMap((g) => g.runs.map((run) => el("a", { href: `/runs/${run.id}` }, run.id)))),
        diff.map((d) => el("td", {}, d.values[i]))))));
  }

  /** x: the worker counts (evenly spaced, as the original's log2 axis). */
  function workerCounts(doc) {
    return [...new Set(doc.families.flatMap((f) => f.groups.map((g) => g.workers)))].sort((a, b) => a - b);
  }
  // x is the index of the worker count: evenly spaced counts (as the original's log2 axis),
  // with half a slot of margin for the bars
  const ordinal = () => ({ x: { time: false, range: () => [-0.5, counts.length - 0.5] } });
  const slots = () => counts.map((_, i) => i);
  const xSeries = () => ({ label: "workers", value: (u, v) => (v === null || v === undefined ? "-" : counts[v]) });
  let counts = [];
  const xAxis = () => ({ ...axis("number of workers"), splits: () => counts.map((_, i) => i),
    values: (u, splits) => splits.map((i) => (counts[i] === undefined ? "" : counts[i])) });
  const byCount = (counts, groups, value) => counts.map((k) => { const g = groups.find((x) => x.workers === k); return g ? value(g) : null; });

  function speedupChart(doc, counts) {
    const series = [xSeries()], data = [slots()];
    doc.families.forEach((family, i) => {
      const stroke = colour(i), base = Math.min(...family.groups.map((g) => g.workers));
      const name = doc.families.length > 1 ? ` (${family.label})` : "";
      series.push({ label: `speedup${name}`, stroke, width: 2, spanGaps: true, points: { show: true, size: 7 }, value: (u, v) => show(v, (x) => `${x.toFixed(2)}x`) });
      data.push(byCount(counts, family.groups, (g) => g.speedup));
      series.push({ label: `fastest run${name}`, stroke, width: 1, dash: [2, 4], alpha: 0.6, spanGaps: true, points: { show: true, size: 4 }, value: (u, v) => show(v, (x) => `${x.toFixed(2)}x`) });
      data.push(byCount(counts, family.groups, (g) => (g.speedup_range ? g.speedup_range[1] : null)));
      series.push({ label: `ideal (linear) from ${workerLabel(base)}${name}`, stroke, width: 1, dash: [8, 6], alpha: 0.45, value: (u, v) => show(v, (x) => `${x.toFixed(2)}x`) });
      data.push(counts.map((k) => (k >= base ? k / base : null)));
    });
    chart("chart-speedup", (width) => ({
      width, height: 280, scales: ordinal(), axes: [xAxis(), axis("speedup (x)")], series }), "no runs").update(data, true);
    const any = doc.families.some((f) => f.groups.some((g) => g.speedup !== null));
    document.getElementById("speedup-note").textContent = any
      ? "Median of the repeats; the dotted line joins each count's fastest run."
      : "No run reached its goal: no time to goal to compare.";
    document.getElementById("chart-speedup").dataset.speedups = JSON.stringify(
      doc.families.flatMap((f) => f.groups.map((g) => [g.workers, g.speedup])));
  }

  function costChart(doc, counts) {
    const families = doc.families.filter((f) => f.metric === "time to accuracy");
    const series = [xSeries()], data = [slots()];
    families.forEach((family, i) => {
      const align = families.length === 1 ? 0 : (i % 2 ? 1 : -1);
      series.push({ label: families.length > 1 ? family.label : "cost to goal (median)", stroke: colour(i), fill: `${colour(i)}bb`,
        paths: bars(align), points: { show: false }, value: (u, v) => show(v, usd) });
      data.push(byCount(counts, family.groups, (g) => (g.cost ? g.cost.median : null)));
    });
    chart("chart-cost", (width) => ({
      width, height: 280, scales: { ...ordinal(), y: { range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1] } },
      axes: [xAxis(), axis("USD", (u, vals) => vals.map(usd), 80)], series }), "no run reached its goal").update(families.length ? data : null, true);
    document.getElementById("cost-note").textContent = doc.usd_per_node_hour === null
      ? "No price given: local runs cost $0 (enter a price per node-hour or an instance above)."
      : `Node-seconds to the goal (evaluation included) at $${doc.usd_per_node_hour} per node-hour.`;
  }

  /** One series per run (the median run of each worker count bold, other repeats faint). Of
   *  several families, the colour is the family's and the line style the worker count's; of
   *  one, the colour is the worker count's (as `mlbench charts` draws them). */
  function curveChart(doc, id, key, yLabel, format) {
    const tables = [], series = [{ label: "training time", value: (u, v) => show(v, fmt.dur) }];
    const multi = doc.families.length > 1;
    const goals = new Set();
    doc.families.forEach((family, f) => {
      if (family.goal !== null && key === "evaluations") goals.add(JSON.stringify([family.goal_display, family.goal_text]));
      family.groups.forEach((group) => {
        const w = counts.indexOf(group.workers);
        for (const run of group.runs) {
          const points = run[key];
          if (!points.length) continue;
          tables.push([points.map((p) => p[0]), points.map((p) => p[1])]);
          const label = `${workerLabel(group.workers)}${multi ? `, ${family.label}` : ""}${run.lead ? "" : ` (${run.id})`}`;
          series.push({ label, stroke: colour(multi ? f : w), width: run.lead ? 2 : 1, alpha: run.lead ? 1 : 0.35,
            dash: multi ? STYLES[w % STYLES.length] : undefined, spanGaps: true, points: { size: 4 }, value: (u, v) => show(v, format) });
        }
      });
    });
    let data = tables.length ? uPlot.join(tables) : null;
    if (data) {
      for (const goal of goals) {
        const [value, text] = JSON.parse(goal);
        series.push({ label: `target ${text}`, stroke: "#111827", width: 1.2, dash: [3, 4], points: { show: false }, value: (u, v) => show(v, format) });
        data.push(data[0].map(() => value));
      }
    }
    chart(id, (width) => ({
      width, height: 280, scales: { x: { time: false, range: (u, min, max) => [0, max > 0 ? max * 1.04 : 1] } },
      axes: [axis("training time (s)"), axis(yLabel)], series }), "no curve recorded").update(data, true);
  }

  function communicationChart(doc, counts) {
    const series = [xSeries()], data = [slots()];
    const multi = doc.families.length > 1;
    doc.families.forEach((family, i) => {
      const name = multi ? ` (${family.label})` : "";
      const stroke = colour(i);
      const ratio = (g) => (g.compute_seconds ? (g.communication_seconds / g.compute_seconds).toFixed(2) : "-");
      const groupAt = (u, i) => family.groups.find((x) => x.workers === counts[i]);
      series.push({ label: `computation${name}`, stroke, fill: `${stroke}cc`, paths: bars(-1), points: { show: false },
        value: (u, v, si, i) => show(v, (x) => `${x.toFixed(1)}%`) });
      data.push(byCount(counts, family.groups, (g) => (g.communication_share === null ? null : 100 * (1 - g.communication_share))));
      series.push({ label: `communication${name}`, stroke, fill: `${stroke}55`, paths: bars(1), points: { show: false },
        value: (u, v, si, i) => { const g = i === null || i === undefined ? null : groupAt(u, i); return show(v, (x) => `${x.toFixed(1)}% (ratio ${g ? ratio(g) : "-"})`); } });
      data.push(byCount(counts, family.groups, (g) => (g.communication_share === null ? null : 100 * g.communication_share)));
    });
    chart("chart-communication", (width) => ({
      width, height: 280, scales: { ...ordinal(), y: { range: [0, 100] } },
      axes: [xAxis(), axis("share of step time (%)")], series }), "no phase times recorded").update(data, true);
  }

  /** Task 0a: bandwidth against message size (log-log), a line per worker count (and network) and dtype. */
  function sweepChart(doc) {
    const tables = [], series = [{ label: "bytes", value: (u, v) => show(v, fmt.bytes) }];
    doc.families.forEach((family) => family.groups.forEach((group, g) => {
      const dtypes = [...new Set(group.sweep.map((p) => p.dtype))];
      dtypes.forEach((dtype, d) => {
        const points = group.sweep.filter((p) => p.dtype === dtype && p.value > 0).sort((a, b) => a.bytes - b.bytes);
        if (!points.length) return;
        tables.push([points.map((p) => p.bytes), points.map((p) => p.value)]);
        series.push({ label: `${group.label}, ${dtype}`, stroke: colour(tables.length - 1), width: 1.5,
          dash: d % 2 ? [6, 4] : undefined, spanGaps: true, points: { size: 4 }, value: (u, v) => show(v, (x) => `${Number(x.toPrecision(3))} GB/s`) });
      });
    }));
    chart("chart-sweep", (width) => ({
      width, height: 300, scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
      axes: [axis("message size (bytes)"), axis("bandwidth (GB/s)", (u, vals) => vals.map((v) => (v === null || v === undefined ? "" : String(Number(v.toPrecision(2))))), 70)], series }), "no measurement above 0 GB/s")
      .update(tables.length ? uPlot.join(tables) : null, true);
    document.getElementById("chart-sweep").dataset.lines = JSON.stringify(series.slice(1).map((s) => s.label));
  }

  /** Time to accuracy against the emulated bandwidth (or latency: doc.network names the setting the
   *  runs differ in), a line per worker count and family (its network aside). */
  function networkChart(doc) {
    const bandwidth = doc.network === "bandwidth";
    const lines = new Map();
    for (const family of doc.families) {
      if (!family.network || (bandwidth && !family.bandwidth_bps)) continue;
      for (const g of family.groups) {
        const tta = g.time_to_accuracy && g.time_to_accuracy.median;
        if (tta === null || tta === undefined) continue;
        const label = `${workerLabel(g.workers)}, ${family.line}`;
        if (!lines.has(label)) lines.set(label, []);
        lines.get(label).push([bandwidth ? family.bandwidth_bps / 1e6 : family.latency_s * 1e3, tta]);
      }
    }
    const unit = bandwidth ? "Mbit/s" : "ms";
    const tables = [...lines.values()].map((points) => { points.sort((a, b) => a[0] - b[0]); return [points.map((p) => p[0]), points.map((p) => p[1])]; });
    const series = [{ label: unit, value: (u, v) => show(v, (x) => `${Number(x.toPrecision(4))} ${unit}`) },
      ...[...lines.keys()].map((label, i) => ({ label, stroke: colour(i), width: 2, spanGaps: true, points: { size: 6 }, value: (u, v) => show(v, fmt.dur) }))];
    chart("chart-network", (width) => ({
      width, height: 280, scales: { x: { time: false, distr: bandwidth ? 3 : 1 } },
      axes: [axis(bandwidth ? "emulated bandwidth (Mbit/s)" : "emulated one-way latency (ms)"), axis("time to goal (s)")], series }), "no run reached its goal")
      .update(tables.length ? uPlot.join(tables) : null, true);
    document.getElementById("network-title").textContent = `Time to goal vs emulated ${doc.network}`;
    document.getElementById("chart-network").dataset.lines = JSON.stringify([...lines.keys()]);
  }

  async function load() {
    const query = new URLSearchParams([...new FormData(form)].filter(([, v]) => String(v).trim()));
    const problem = document.getElementById("problem");
    if (![...query.keys()].some((k) => ["runs", "group", "task"].includes(k))) {
      problem.textContent = "Choose runs to compare: select them on the Runs page, or give run ids, a group or a task above.";
      problem.classList.remove("hidden");
      return;
    }
    try {
      const doc = await api(`/api/compare?${query}`);
      problem.classList.add("hidden");
      document.getElementById("content").classList.remove("hidden");
      document.getElementById("heading").textContent = `Compare: ${doc.task}`;
      counts = workerCounts(doc);
      tables(doc);
      configDiff(doc);
      speedupChart(doc, counts);
      costChart(doc, counts);
      curveChart(doc, "chart-loss", "losses", "training loss", (x) => x.toFixed(4));
      const unit = doc.metric.unit === "fraction" ? "%" : doc.metric.unit ? ` ${doc.metric.unit}` : "";
      curveChart(doc, "chart-accuracy", "evaluations", doc.metric.axis, (x) => `${x.toFixed(2)}${unit}`);
      document.getElementById("chart-accuracy").dataset.axis = doc.metric.axis;  // the canvas draws it
      document.getElementById("chart-accuracy-title").textContent = `${doc.metric.title[0].toUpperCase()}${doc.metric.title.slice(1)} vs training time`;
      communicationChart(doc, counts);
      document.getElementById("training-charts").classList.toggle("hidden", doc.sweep);
      document.getElementById("sweep-card").classList.toggle("hidden", !doc.sweep);
      if (doc.sweep) sweepChart(doc);
      document.getElementById("network-card").classList.toggle("hidden", !doc.network);
      if (doc.network) networkChart(doc);
    } catch (err) {
      problem.textContent = err.message;
      problem.classList.remove("hidden");
      document.getElementById("content").classList.add("hidden");
    }
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const query = new URLSearchParams([...new FormData(form)].filter(([, v]) => String(v).trim()));
    history.replaceState(null, "", `/compare?${query}`);
    load();
  });
  load();
})();
