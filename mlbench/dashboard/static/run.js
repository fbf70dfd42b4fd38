/* A run's page: what it is, how it goes (live curves), where time goes, its workers' logs. */
"use strict";

(() => {
  const { el, fmt } = MB;
  MB.navigation("runs");
  const runId = decodeURIComponent(location.pathname.split("/").pop());
  const state = { doc: null, training: [], evaluations: [], logs: new Map(), logShown: null, logChosen: false };
  // how the training curves are drawn, chosen above them; every redraw (a live update) keeps it
  const view = { smoothing: 0, log: false };
  const MAX_LOG_CHARS = 2000000;

  document.getElementById("download").href = `/api/runs/${runId}/download`;
  document.getElementById("mllog").href = `/api/runs/${runId}/mllog`;

  // -- charts --------------------------------------------------------------------------------
  const axis = (label, values, size) => ({ label, stroke: "#667085", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#e3e6eb" },
    ...(values ? { values } : {}), ...(size ? { size } : {}) });
  const fromZero = { time: false, range: (u, min, max) => [0, max > 0 ? max * 1.04 : 1] };
  const logTicks = (u, vals) => vals.map((v) => (v === null || v === undefined ? "" : String(Number(v.toPrecision(2)))));
  const lossValue = (u, v) => (v === null || v === undefined ? "-" : v.toFixed(4));
  // the goal metric as the server describes it (title, axis label, unit); values come plotted (percent for a fraction)
  const metricOf = () => (state.doc ? state.doc.spec.metric : { title: "goal metric", axis: "goal metric", unit: "" });
  // what the task's throughput counts ("images/s", "target tokens/s")
  const unitOf = () => (state.doc && state.doc.summary.throughput_unit) || "samples/s";
  const metricValue = (u, v) => (v === null || v === undefined ? "-" : `${Number(v.toFixed(4))}${metricOf().unit === "fraction" ? "%" : ""}`);
  const [METRIC_COLOUR, LOSS_COLOUR, THROUGHPUT_COLOUR, BYTES_COLOUR] = [0, 1, 2, 4].map((i) => MB.COLOURS[i]);

  /** TensorBoard's smoothing of a curve: the exponential moving average of its points with weight
   *  `weight` (0: none), divided by 1 - weight^n so that its first points are not pulled towards 0. */
  function smooth(values, weight) {
    if (!weight) return values;
    let last = 0, n = 0;
    return values.map((v) => {
      if (v === null || v === undefined || !Number.isFinite(v)) return v;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - weight ** n);
    });
  }
  /** A curve as drawn: smoothed as chosen; on a log scale, without the values it cannot show (0 or less). */
  const drawn = (values) => smooth(values, view.smoothing).map((v) => (view.log && !(v > 0) ? null : v));
  // a y scale: logarithmic when chosen, else `linear` (uPlot's own range when not given)
  const yScale = (linear = {}) => (view.log ? { distr: 3, log: 10 } : linear);

  // the faults, restarts and resumes of the run's timeline, each at the x of the training point of its step
  const MARK_COLOURS = { fault: "#d62728", missed: "#d62728", restart: "#ea580c", shrink: "#ea580c", resume: "#667085" };
  function marksFor(key) {
    const moments = (state.doc && state.doc.timeline && state.doc.timeline.moments) || [];
    return moments.filter((m) => m.step !== null && m.step !== undefined).flatMap((m) => {
      const point = state.training.find((p) => p.step >= m.step && p[key] !== null);
      return point ? [{ x: point[key], kind: m.kind, text: m.text }] : [];
    });
  }
  const marksPlugin = (key) => ({ hooks: { draw: [(u) => {
    const ctx = u.ctx, { top, height } = u.bbox;
    ctx.save();
    for (const mark of marksFor(key)) {
      const x = Math.round(u.valToPos(mark.x, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = MARK_COLOURS[mark.kind] || "#d62728";
      ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.setLineDash(mark.kind === "missed" ? [4 * devicePixelRatio, 4 * devicePixelRatio] : []);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
    }
    ctx.restore();
  }] } });

  function accuracyLossOptions(xLabel, xValue, key) {
    return (width) => {
      const metric = metricOf();
      const percent = metric.unit === "fraction";
      const range = percent ? (u, min, max) => [Math.max(0, Math.min(min, 50) - 5), Math.min(100, Math.max(max, 60) + 5)]
        : (u, min, max) => [Math.max(0, min - 0.05 * Math.abs(max - min) - 1e-9), max + 0.05 * Math.abs(max - min) + 1e-9];
      return {
        width, height: 260, plugins: [marksPlugin(key)],
        scales: { x: fromZero, metric: yScale({ range }), loss: yScale() },
        axes: [axis(xLabel), { ...axis(metric.axis, view.log ? logTicks : null), scale: "metric" },
               { ...axis("training loss", view.log ? logTicks : null), scale: "loss", side: 1, grid: { show: false } }],
        series: [
          { label: xLabel, value: xValue },
          { label: metric.title, scale: "metric", stroke: METRIC_COLOUR, width: 2, spanGaps: true, points: { show: true, size: 5 }, value: metricValue },
          { label: "goal", scale: "metric", stroke: "#111827", width: 1.2, dash: [6, 5], points: { show: false }, value: metricValue },
          { label: "training loss", scale: "loss", stroke: LOSS_COLOUR, width: 1.5, spanGaps: true, value: lossValue },
        ],
      };
    };
  }
  const seconds = (u, v) => (v === null || v === undefined ? "-" : fmt.dur(v));
  const charts = {
    time: new MB.Chart(document.getElementById("chart-time"), accuracyLossOptions("training time (s)", seconds, "time"), "no measurement yet"),
    epoch: new MB.Chart(document.getElementById("chart-epoch"), accuracyLossOptions("epoch", (u, v) => fmt.num(v), "epoch"), "no measurement yet"),
    throughput: new MB.Chart(document.getElementById("chart-throughput"), (width) => ({
      width, height: 220, scales: { x: fromZero, y: yScale() },
      axes: [axis("training time (s)"), axis(unitOf(), view.log ? logTicks : null, 70)],
      series: [{ label: "training time", value: seconds },
               { label: unitOf(), stroke: THROUGHPUT_COLOUR, width: 1.5, fill: `${THROUGHPUT_COLOUR}14`, value: (u, v) => fmt.rate(v, unitOf()) }],
    }), "no measurement yet"),
    sweep: new MB.Chart(document.getElementById("chart-sweep"), (width) => ({
      width, height: 260, scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
      axes: [axis("message size (bytes)"), axis(state.doc && state.doc.sweep ? state.doc.sweep.metric.axis : "GB/s", logTicks, 70)],
      series: [{ label: "bytes", value: (u, v) => (v === null || v === undefined ? "-" : fmt.bytes(v)) },
               ...(state.doc && state.doc.sweep ? state.doc.sweep.lines : []).map((line, i) => ({
                 label: line.label, stroke: MB.COLOURS[i % MB.COLOURS.length], width: 1.5, spanGaps: true,
                 points: { show: true, size: 4 }, value: (u, v) => (v === null || v === undefined ? "-" : `${Number(v.toPrecision(3))} ${state.doc.sweep.metric.unit}`) }))],
    }), "no measurement yet"),
    bytes: new MB.Chart(document.getElementById("chart-bytes"), (width) => ({
      width, height: 220, scales: { x: fromZero },
      axes: [axis("training time (s)"), axis("sent", (u, vals) => vals.map((v) => fmt.bytes(v)), 70)],
      series: [{ label: "training time", value: seconds },
               { label: "bytes sent", stroke: BYTES_COLOUR, width: 1.5, value: (u, v) => fmt.bytes(v) }],
    }), "nothing sent yet (one worker sends nothing)"),
  };

  // -- per worker: a metric's line per rank (or their mean), and the System chart -----------------
  // both from /api/runs/RUN/ranks, asked again whenever the run's events grew (one request at a time)
  const MEMORY = "sys/rss_bytes", CPU = "sys/cpu_percent";
  const ranks = { metric: "train/loss", mode: "all", lines: [], system: [], busy: false, again: false };
  const rankColour = (line, i) => MB.COLOURS[(line.rank === null ? i : line.rank) % MB.COLOURS.length];
  const valueOf = (name) => (u, v) => (v === null || v === undefined ? "-" : name.includes("bytes") ? fmt.bytes(v)
    : name.endsWith("_percent") ? `${v.toFixed(1)}%` : name.startsWith("time/") ? `${Number(v.toPrecision(3))} s`
    : String(Number(v.toPrecision(4))));
  const ticksOf = (name) => (u, vals) => vals.map((v) => valueOf(name)(u, v));
  // each line's values as the view draws them: smoothed, and (a metric's chart) on the log scale
  const linesData = (lines, draw) => (lines.length
    ? uPlot.join(lines.map((line) => [line.points.map((p) => p[0]), draw(line.points.map((p) => p[1]))])) : null);
  const drawers = { ranks: drawn, system: (values) => smooth(values, view.smoothing) };
  const shape = (lines) => lines.map((line) => `${line.metric}/${line.rank}`).join(",");
  charts.ranks = new MB.Chart(document.getElementById("chart-ranks"), (width) => ({
    width, height: 220, scales: { x: fromZero, y: yScale() },
    axes: [axis("training time (s)"), axis((ranks.lines[0] || ranks).metric, ticksOf((ranks.lines[0] || ranks).metric), 70)],
    series: [{ label: "training time", value: seconds }, ...ranks.lines.map((line, i) => ({
      label: line.label, stroke: rankColour(line, i), width: 1.5, spanGaps: true, value: valueOf(line.metric) }))],
  }), "no measurement yet");
  charts.system = new MB.Chart(document.getElementById("chart-system"), (width) => ({
    width, height: 220,
    scales: { x: fromZero, memory: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] },
              cpu: { range: (u, min, max) => [0, Math.max(100, max * 1.1)] } },
    axes: [axis("training time (s)"), { ...axis("resident memory", ticksOf(MEMORY), 84), scale: "memory" },
           { ...axis("CPU (% of one core)", ticksOf(CPU), 60), scale: "cpu", side: 1, grid: { show: false } }],
    series: [{ label: "training time", value: seconds }, ...ranks.system.map((line, i) => ({
      label: `${line.metric === MEMORY ? "memory" : "CPU"}, ${line.label}`, scale: line.metric === MEMORY ? "memory" : "cpu",
      stroke: rankColour(line, i), width: 1.5, spanGaps: true, ...(line.metric === CPU ? { dash: [5, 4] } : {}),
      value: valueOf(line.metric) }))],
  }), "no system metrics yet (they come with each logging interval; an older mlbench recorded none)");

  function showLines(chart, lines, previous, restyle = false) {
    const box = document.getElementById(`chart-${chart}`);
    charts[chart].update(linesData(lines, drawers[chart]), restyle || shape(lines) !== previous);
    box.dataset.lines = lines.length;
    box.dataset.points = lines.reduce((n, line) => n + line.points.length, 0);
  }

  async function drawRanks() {
    if (ranks.busy) { ranks.again = true; return; }
    ranks.busy = true;
    try {
      do {
        ranks.again = false;
        const { metric, mode } = ranks;
        // one request for both charts: the run's events are read once
        const query = new URLSearchParams({ metric, lines: mode, each: `${MEMORY},${CPU}` });
        const perRank = await MB.api(`/api/runs/${encodeURIComponent(runId)}/ranks?${query}`);
        const select = document.getElementById("rank-metric");
        const names = perRank.metrics.length ? perRank.metrics : [ranks.metric];
        if ([...select.options].map((o) => o.value).join() !== names.join()) {
          select.replaceChildren(...names.map((name) => el("option", { value: name }, name)));
          select.value = ranks.metric;
        }
        const before = [shape(ranks.lines), shape(ranks.system)];
        ranks.lines = perRank.lines; ranks.system = perRank.each;
        showLines("ranks", ranks.lines, before[0]);
        showLines("system", ranks.system, before[1]);
        Object.assign(document.getElementById("chart-ranks").dataset, { metric, mode });
      } while (ranks.again);
    } catch (err) {
      // the next update of the run asks again
    } finally {
      ranks.busy = false;
    }
  }
  for (const [id, key] of [["rank-metric", "metric"], ["rank-lines", "mode"]]) {
    document.getElementById(id).addEventListener("change", (event) => {
      ranks[key] = event.target.value;
      ranks.lines = [];  // its axis and series change: drawn afresh
      drawRanks();
    });
  }

  function accuracyLossData(key) {
    const goal = state.doc && state.doc.spec.metric.goal_display;
    const train = state.training.filter((p) => p[key] !== null && p.loss !== null);
    const evals = state.evaluations.filter((p) => p[key] !== null && p[key] !== undefined);
    if (!train.length && !evals.length) return null;
    const joined = uPlot.join([
      [evals.map((p) => p[key]), drawn(evals.map((p) => p.value))],
      [train.map((p) => p[key]), drawn(train.map((p) => p.loss))],
    ]);
    const goalLine = joined[0].map(() => (goal === null || goal === undefined || (view.log && !(goal > 0)) ? null : goal));
    return [joined[0], joined[1], goalLine, joined[2]];
  }

  /** Draws the training charts from the points so far; `restyle`: their scales were changed. */
  function drawCharts(restyle = false) {
    const rebuild = restyle || (state.doc && state.metricShown !== state.doc.spec.metric.name);  // axes name the metric
    if (state.doc) state.metricShown = state.doc.spec.metric.name;
    charts.time.update(accuracyLossData("time"), rebuild);
    charts.epoch.update(accuracyLossData("epoch"), rebuild);
    const rated = state.training.filter((p) => p.throughput !== null);
    const unitRebuild = restyle || (state.doc && state.unitShown !== unitOf());  // the axis names the task's unit
    if (state.doc) state.unitShown = unitOf();
    charts.throughput.update(rated.length ? [rated.map((p) => p.time), drawn(rated.map((p) => p.throughput))] : null,
                             unitRebuild);
    document.getElementById("chart-throughput").dataset.axis = unitOf();  // the canvas draws it
    const sent = state.training.filter((p) => p.bytes > 0);
    charts.bytes.update(sent.length ? [state.training.map((p) => p.time), state.training.map((p) => p.bytes)] : null);
    document.getElementById("chart-time").dataset.evaluations = state.evaluations.length;
    document.getElementById("chart-time").dataset.axis = metricOf().axis;  // the canvas draws it
    document.getElementById("chart-time").dataset.training = state.training.length;
    document.getElementById("chart-time").dataset.marks = JSON.stringify(marksFor("time").map((m) => m.kind));
  }

  const smoothing = document.getElementById("smoothing"), logScale = document.getElementById("log-scale");
  smoothing.addEventListener("input", () => {
    view.smoothing = Number(smoothing.value);
    document.getElementById("smoothing-value").textContent = view.smoothing.toFixed(2);
    drawCharts();
    showLines("ranks", ranks.lines, shape(ranks.lines));
    showLines("system", ranks.system, shape(ranks.system));
  });
  logScale.addEventListener("change", () => {
    view.log = logScale.checked;
    drawCharts(true);
    showLines("ranks", ranks.lines, shape(ranks.lines), true);   // the system chart's scales stay linear
  });

  // -- facts -----------------------------------------------------------------------------------
  function facts(target, pairs) {
    document.getElementById(target).replaceChildren(...pairs.filter(([, v]) => v !== null && v !== undefined && v !== "")
      .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, v)]));
  }

  function showRun(doc) {
    const run = doc.run, spec = doc.spec, s = doc.summary;
    document.title = `${run.name} · mlbench dashboard`;
    document.getElementById("name").textContent = run.name;
    document.getElementById("state").replaceChildren(MB.badge(run.state));
    document.getElementById("run-id").textContent = run.id;
    document.getElementById("cancel").classList.toggle("hidden", !(run.state === "running" || run.state === "pending"));
    const result = document.getElementById("result");
    result.textContent = doc.result || "";
    result.className = `result ${run.state}` + (doc.result ? "" : " hidden");
    const options = Object.entries(spec.optimizer_options || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    facts("spec", [
      ["task", spec.title ? `${spec.task}: ${spec.title}` : spec.task],
      ["framework", spec.framework],
      ["model", spec.model],
      ["workers", spec.threads_per_worker ? `${spec.workers_text} x ${spec.threads_per_worker} thread(s)` : spec.workers_text],
      ["optimizer", doc.sweep ? null : options ? `${spec.optimizer} (${options})` : spec.optimizer],
      ["plug-in", spec.plugin ? `${spec.plugin}; sha256 ${spec.plugin_sha256}` : null],
      ["model plug-in", spec.model_plugin ? `${spec.model_plugin}; sha256 ${spec.model_plugin_sha256}` : null],
      ["division", spec.changed.length ? `${spec.division} (${spec.changed.join(", ")})` : spec.division],
      ["device", [spec.device, spec.backend].filter(Boolean).join(" / ")],
      ["network", spec.network_text || spec.network || "as it is (not emulated)"],   // status RUN's words
      ["data", doc.sweep ? null : spec.data_dir ? `${spec.data} (${spec.data_dir})` : spec.data],
      ["goal", doc.sweep ? "none (a benchmark of the all-reduce)" : spec.metric.goal_text === null ? "none (synthetic data)" : `${spec.metric.goal_text}${spec.light ? " (light)" : ""}`],
      ["stop at goal", spec.stop_at_goal === false ? "no (--no-stop)" : null],
      ["time budget", spec.time_budget_s ? fmt.dur(spec.time_budget_s) : null],
      ["max steps", spec.max_steps],
      ["log every", doc.sweep || !spec.log_every ? null : `${spec.log_every} steps`],
      ["checkpoints", spec.checkpoints],
      ["resumes", spec.resumes],
      ...(spec.faults || []),
      ["seed", spec.seed],
      ["machine", [spec.host, spec.cpu && `${spec.cpu}${spec.cores ? ` (${spec.cores} cores)` : ""}`, ...(spec.gpus || [])].filter(Boolean).join(", ")],
      ["created", fmt.time(run.created_at)],
      ["reason", run.reason],
    ]);
    // task 0a measures the all-reduce: no epochs, losses or phases, its numbers are the sweep's
    facts("progress", doc.sweep ? [
      ["measurements", doc.sweep.rows.length],
      [`peak ${doc.sweep.metric.title}`, doc.sweep.peak_text],
      ["small-message latency", doc.sweep.latency_text],
      ["errors", s.errors.length ? s.errors.join("; ") : null],
    ] : [
      ["epoch", fmt.num(s.epoch)],
      ["steps", s.steps],
      ["training time", fmt.dur(s.train_time)],
      ["last training loss", s.last_train_loss === null ? "-" : s.last_train_loss.toFixed(4)],
      [s.last_metric_title, doc.sweep ? null : s.last_metric_text === null ? "-" : s.last_metric_text],
      ["last test loss", s.test_loss_is_metric ? null
        : s.last_test_loss === null || s.last_test_loss === undefined ? "-" : s.last_test_loss.toFixed(4)],
      ["throughput", s.throughput ? `${fmt.rate(s.throughput, s.throughput_unit)} (all workers)` : "-"],
      ["bytes sent", s.ranks.length ? `${fmt.bytes(s.bytes_sent_mean)} per worker (${s.bytes_sent.map(fmt.bytes).join(", ")})` : "-"],
      ["communication / compute", s.communication_ratio === null ? "-" : s.communication_ratio.toFixed(3)],
      ["compression", s.compression ? `the reference all-reduce would have sent ${s.compression.toFixed(2)}x the bytes` : null],
      ...(doc.system ? doc.system.rows : []),
      // the errors of the group that ran last; a failure's are under it in the faults card
      ["errors", doc.timeline.errors.length ? doc.timeline.errors.join("; ") : null],
    ]);
    showTimeline(doc.timeline);
    for (const which of ["time", "epoch"]) {
      document.getElementById(`chart-${which}-title`).textContent =
        `${spec.metric.title[0].toUpperCase()}${spec.metric.title.slice(1)} and training loss vs ${which === "time" ? "training time" : "epochs"}`;
    }
    document.getElementById("training-charts").classList.toggle("hidden", Boolean(doc.sweep));
    document.getElementById("chart-tools").classList.toggle("hidden", Boolean(doc.sweep));
    showSweep(doc.sweep);
    document.getElementById("phases-card").classList.toggle("hidden", Boolean(doc.sweep));
    showPhases(s);
    showLogTabs(doc.logs);
  }

  /** The faults, restarts and resumes in time order, each failure's errors under it. */
  function showTimeline(timeline) {
    document.getElementById("faults-card").classList.toggle("hidden", !timeline.moments.length);
    document.getElementById("timeline").replaceChildren(...timeline.moments.map((m) => el("li", { "data-kind": m.kind },
      el("span", { class: "mono muted" }, `+${m.at.toFixed(1)}s `), m.text,
      ...(m.errors.length ? [el("ul", { class: "errors" }, ...m.errors.map((e) => el("li", { class: "mono" }, e)))] : []))));
  }

  /** Task 0a: the sweep's table and its bandwidth against message size, a line per dtype. */
  function showSweep(sweep) {
    document.getElementById("sweep-card").classList.toggle("hidden", !sweep);
    if (!sweep) return;
    document.getElementById("sweep-peak").textContent = `Peak ${sweep.metric.title} ${sweep.peak_text}; small-message latency ${sweep.latency_text}.`;
    document.getElementById("sweep").replaceChildren(
      el("thead", {}, el("tr", {}, sweep.headers.map((h, i) => el("th", { class: i ? "num" : null }, h)))),
      el("tbody", {}, sweep.rows.map((row) => el("tr", { "data-dtype": row[0], "data-elements": row[1] },
        row.map((cell, i) => el("td", { class: i ? "num" : null }, cell))))));
    const lines = sweep.lines.map((line) => [line.points.map((p) => p[0]), line.points.map((p) => p[1])]);
    const data = lines.length ? uPlot.join(lines) : null;
    charts.sweep.update(data, true);
    document.getElementById("chart-sweep").dataset.lines = sweep.lines.length;
  }

  function showPhases(s) {
    const table = document.getElementById("phases");
    table.dataset.note = s.phases_note || "";
    if (s.phases_note) {  // a port's compiled step, --no-timing: said, never a table of zeros
      table.replaceChildren(el("tbody", {}, el("tr", {}, el("td", { class: "note" }, `Time per phase: ${s.phases_note}.`))));
      document.getElementById("comm").textContent = "";
      return;
    }
    const ranks = s.ranks || [];
    const head = el("tr", {}, el("th", {}, "phase"), el("th", { class: "num" }, "mean"), el("th", { class: "num" }, "max"),
      el("th", { class: "num" }, "share of step"), ...ranks.map((r) => el("th", { class: "num" }, `worker ${r}`)));
    const line = (name, mean, max, share, values) => el("tr", { "data-phase": name }, el("td", {}, name),
      el("td", { class: "num" }, mean.toFixed(2)), el("td", { class: "num" }, max.toFixed(2)),
      el("td", { class: "num" }, share === null ? "" : `${(100 * share).toFixed(1)}%`),
      ...values.map((v) => el("td", { class: "num" }, v.toFixed(2))));
    table.replaceChildren(el("thead", {}, head), el("tbody", {},
      ...(s.phases || []).map((p) => line(p.phase, p.mean, p.max, p.share, p.ranks)),
      ranks.length ? line("evaluation", s.evaluation.mean, s.evaluation.max, null, s.evaluation.ranks) : null));
    document.getElementById("comm").textContent = s.communication_ratio === null ? "" :
      `Compute vs communication: communication/compute = ${s.communication_ratio.toFixed(3)}; ${fmt.bytes(s.bytes_sent_mean)} sent per worker.`;
  }

  // -- logs --------------------------------------------------------------------------------------
  const logOrder = (a, b) => (a.startsWith("rank-") === b.startsWith("rank-")
    ? a.localeCompare(b, "en", { numeric: true }) : (a.startsWith("rank-") ? -1 : 1));

  /** Tabs per log, workers first; worker 0's is shown until the user picks another. */
  function showLogTabs(names) {
    for (const name of names) if (!state.logs.has(name)) state.logs.set(name, "");
    const all = [...state.logs.keys()].sort(logOrder);
    if (!state.logChosen && all.length) state.logShown = all[0];
    document.getElementById("log-tabs").replaceChildren(...all.map((name) =>
      el("button", { type: "button", class: name === state.logShown ? "here" : null, "data-log": name,
        onclick: () => { state.logShown = name; state.logChosen = true; showLogTabs([]); showLog(true); } }, name.replace(/\.log$/, ""))));
  }

  function showLog(jump) {
    const pre = document.getElementById("log");
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 30;
    pre.textContent = state.logs.get(state.logShown) || "(nothing written yet)";
    if (jump || atEnd) pre.scrollTop = pre.scrollHeight;
  }

  // -- live --------------------------------------------------------------------------------------
  MB.stream({ run: runId }, {
    run(message) {
      if (message.reset) {
        state.training = message.series.training;
        state.evaluations = message.series.evaluations;
      } else {
        for (const [name, part] of Object.entries(message.append)) {
          state[name].length = part.from;
          state[name].push(...part.points);
        }
      }
      state.doc = message;
      showRun(message);
      drawCharts();
      if (!message.sweep) drawRanks();
    },
    log(message) {
      let text = (message.reset ? "" : state.logs.get(message.name) || "") + message.text;
      if (text.length > MAX_LOG_CHARS) text = text.slice(text.length - MAX_LOG_CHARS);
      state.logs.set(message.name, text);
      const shown = state.logShown;
      showLogTabs([message.name]);
      if (message.name === state.logShown || shown !== state.logShown) showLog(shown !== state.logShown);
    },
    gone() {
      const box = document.getElementById("problem");
      box.textContent = "This run no longer exists (it was deleted).";
      box.classList.remove("hidden");
    },
    problem(message) {
      const box = document.getElementById("problem");
      box.textContent = message.error;
      box.classList.remove("hidden");
    },
  });

  // the runs table's Cancel and Delete, with their questions
  const thisRun = () => (state.doc ? state.doc.run : { id: runId, name: runId, state: "running" });
  document.getElementById("cancel").addEventListener("click", () => MB.cancelRun(thisRun()));
  document.getElementById("delete").addEventListener("click", async () => {
    if (await MB.deleteRun(thisRun())) location.href = "/";
  });
})();
