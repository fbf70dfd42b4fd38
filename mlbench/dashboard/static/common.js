/* mlbench dashboard: what every page shares (API calls, the live stream, formats, charts). */
"use strict";

const MB = (() => {
  /** Calls the JSON API; changes carry the header that marks the dashboard's own requests. */
  async function api(path, options = {}) {
    const init = { method: options.method || "GET", headers: {}, credentials: "same-origin" };
    if (init.method !== "GET") init.headers["X-Mlbench-Dashboard"] = "1";
    if (options.body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    const response = await fetch(path, init);
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const err = new Error((data && data.error) || `${response.status} ${response.statusText}`);
      err.status = response.status; err.data = data;
      throw err;
    }
    return data;
  }

  /** One server-sent-event stream per page; handlers by event name. */
  function stream(params, handlers) {
    const source = new EventSource(`/api/stream?${new URLSearchParams(params)}`);
    const dot = document.querySelector("header.top .live");
    source.onopen = () => { if (dot) { dot.classList.add("on"); dot.textContent = "live"; } };
    source.onerror = () => { if (dot) { dot.classList.remove("on"); dot.textContent = "reconnecting"; } };
    for (const [name, handler] of Object.entries(handlers)) {
      source.addEventListener(name, (event) => handler(JSON.parse(event.data)));
    }
    return source;
  }

  const fmt = {
    num: (v, digits = 2) => (v === null || v === undefined ? "-" : Number(v).toFixed(digits)),
    dur(seconds) {
      if (seconds === null || seconds === undefined) return "-";
      seconds = Math.max(0, seconds);
      if (seconds < 60) return `${seconds.toFixed(1)}s`;
      const total = Math.round(seconds), h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
      return `${h}:${String(m).padStart(2, "0")}:${String(s).padStart(2, "0")}`;
    },
    // a throughput in the unit of its task ("images/s", "target tokens/s": the API's throughput_unit)
    rate: (v, unit = "samples/s") => (v === null || v === undefined ? "-" : `${Math.round(v).toLocaleString("en-US")} ${unit}`),
    bytes(v) {
      if (v === null || v === undefined) return "-";
      const units = ["B", "KB", "MB", "GB", "TB"];
      let i = 0;
      while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
      return i === 0 ? `${v.toFixed(0)} B` : `${v.toFixed(1)} ${units[i]}`;
    },
    time(ts) {
      if (!ts) return "-";
      const d = new Date(ts * 1000), p = (n) => String(n).padStart(2, "0");
      return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`;
    },
  };

  /** el("td", {class: "num"}, "text", child...) */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function badge(state) { return el("span", { class: `badge ${state}`, "data-state": state }, state); }

  /** Asks before something that cannot be undone; resolves true when confirmed (`action`),
   *  false when dismissed (`keep`, Escape). */
  function confirmDialog(text, action = "Delete", keep = "Cancel") {
    return new Promise((resolve) => {
      const dialog = el("dialog", { class: "confirm" },
        el("p", {}, text),
        el("div", { class: "buttons" },
          el("button", { type: "button", class: "cancel", onclick: () => dialog.close("no") }, keep),
          el("button", { type: "button", class: "danger confirm-yes", onclick: () => dialog.close("yes") }, action)));
      dialog.addEventListener("close", () => { dialog.remove(); resolve(dialog.returnValue === "yes"); });
      document.body.append(dialog);
      dialog.showModal();
    });
  }

  /** Cancels a run (`{id, name}`) once its user confirms: the Cancel of the runs table and of a
   *  run's page. Resolves to the API's answer (`{id, state, reason}`), or null when dismissed
   *  or refused (the refusal is shown). */
  async function cancelRun(run) {
    const question = `Cancel run ${run.id} (${run.name})? Its workers are stopped; what it recorded so far is kept.`;
    if (!(await confirmDialog(question, "Cancel run", "Keep running"))) return null;
    try { return await api(`/api/runs/${run.id}/cancel`, { method: "POST" }); } catch (err) { alert(err.message); return null; }
  }

  /** Deletes a run (`{id, name, state}`) once its user confirms; resolves true when deleted. */
  async function deleteRun(run) {
    const active = run.state === "running" || run.state === "pending" ? " It is still running: it will be cancelled first." : "";
    if (!(await confirmDialog(`Delete run ${run.id} (${run.name}) and everything it recorded?${active}`))) return false;
    try { await api(`/api/runs/${run.id}`, { method: "DELETE" }); return true; } catch (err) { alert(err.message); return false; }
  }


  /**
   * A uPlot chart that fills its container's width and follows it; `update(data)` redraws.
   * `make(width)` returns the uPlot options; an empty data set shows `emptyText` instead.
   */
  class Chart {
    constructor(container, make, emptyText = "no data yet") {
      this.container = container; this.make = make; this.emptyText = emptyText; this.plot = null;
      new ResizeObserver(() => {
        if (this.plot) this.plot.setSize({ width: this.width(), height: this.plot.height });
      }).observe(container);
    }
    width() { return Math.max(280, this.container.clientWidth); }
    update(data, rebuild = false) {
      const empty = !data || !data[0] || data[0].length === 0;
      if (empty) {
        if (this.plot) { this.plot.destroy(); this.plot = null; }
        this.container.replaceChildren(el("div", { class: "empty" }, this.emptyText));
        return;
      }
      if (this.plot && !rebuild) { this.plot.setData(data); return; }
      if (this.plot) this.plot.destroy();
      this.container.replaceChildren();
      this.plot = new uPlot(this.make(this.width()), data, this.container);
    }
  }

  /** Marks the current page in the navigation bar. */
  function navigation(which) {
    for (const link of document.querySelectorAll("header.top nav a")) {
      link.classList.toggle("here", link.dataset.page === which);
    }
  }

  return { api, stream, fmt, el, badge, confirmDialog, cancelRun, deleteRun, Chart, navigation };
})();
