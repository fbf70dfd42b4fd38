/* The new-run form: sent to the API, which checks it with the CLI's code and starts the run.
   Its fields are mlbench run's options by their API names (mlbench/launch/options.py). */
"use strict";

(() => {
  const { el, api } = MB;
  MB.navigation("new");
  const form = document.getElementById("run-form");
  let choices = null;

  function showOptions() {
    const info = choices.optimizers.find((o) => o.name === form.optimizer.value);
    document.getElementById("optimizer-summary").textContent = info ? info.summary : "";
    document.getElementById("options").replaceChildren(...(info ? info.options : []).flatMap((option) => [
      el("label", { for: `opt-${option.name}`, title: option.help }, option.name),
      el("div", { class: "field", "data-option": option.name },
        el("input", { type: "text", id: `opt-${option.name}`, "data-option": option.name, placeholder: option.default === null ? "unset" : `${option.default}`, title: option.help }),
        el("div", { class: "error", "data-for": `optimizer_options.${option.name}` })),
    ]));
  }

  function showTask() {
    const task = choices.tasks.find((t) => t.name === form.task.value);
    document.getElementById("task-title").textContent = task ? task.title : "";
    // the goals as the metric formats them (server side): "test accuracy >= 90.00%", "validation perplexity <= 90.00"
    document.getElementById("light-goal").textContent = task && task.light_text ? `(${task.light_text})` : "";
  }

  /** A field per declared option that new.html does not lay out itself (/api/form's `options`,
   *  made from mlbench/launch/options.py): a check box for a flag, a choice for an option with
   *  choices, lines of text for one given several times, else a line of text. */
  function declaredField(option) {
    const id = option.name, hint = el("div", { class: "hint" }, el("code", {}, option.flag), ` ${option.help}`);
    let input;
    if (option.kind === "bool") {
      input = el("div", { class: "checks" }, el("label", {}, el("input", { type: "checkbox", id, name: id }), ` ${option.flag}`));
    } else if (option.choices) {
      input = el("select", { id, name: id }, el("option", { value: "" }, option.default === null ? "default" : `${option.default} (default)`),
        ...option.choices.filter((c) => c !== option.default).map((c) => el("option", { value: c }, c)));
    } else if (option.multiple) {
      input = el("textarea", { id, name: id, rows: "2", placeholder: `${option.metavar || "VALUE"} per line` });
    } else {
      input = el("input", { type: "text", id, name: id, autocomplete: "off",
        placeholder: option.default === null ? (option.metavar || "") : `${option.default}` });
    }
    return [el("label", { for: id }, option.label), el("div", { class: "field" }, input, hint),
            el("div", { class: "error", "data-for": option.name })];
  }

  /** The declared fields' values by option name: a flag's as the API takes it (a --no-X box
   *  checked: false), the others as typed (empty: the default). */
  function declaredValues() {
    return Object.fromEntries(choices.options.filter((o) => !o.own_field).map((o) => {
      const input = form.elements[o.name];
      return [o.name, o.kind === "bool" ? (o.negated ? !input.checked : input.checked) : input.value];
    }));
  }

  function clearErrors() {
    for (const box of document.querySelectorAll(".error[data-for]")) box.textContent = "";
    for (const field of document.querySelectorAll(".field.invalid")) field.classList.remove("invalid");
  }

  function showErrors(errors) {
    for (const [name, sentence] of Object.entries(errors)) {
      const box = document.querySelector(`.error[data-for="${CSS.escape(name)}"]`) || document.querySelector('.error[data-for="form"]');
      box.textContent = sentence;
      // the field is the grid cell before the error's (a row of two options has one cell of errors)
      const row = (box.parentElement.classList.contains("errors") ? box.parentElement : box).previousElementSibling;
      if (row && row.classList.contains("field")) row.classList.add("invalid");
      if (box.parentElement && box.parentElement.classList.contains("field")) box.parentElement.classList.add("invalid");
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    const body = {
      task: form.task.value, workers: form.workers.value, where: form.where.value,
      light: form.light.checked, stop_at_goal: !form.no_stop.checked, time_budget: form.time_budget.value,
      max_steps: form.max_steps.value, data: form.querySelector("input[name=data]:checked").value,
      data_dir: form.data_dir.value, optimizer: form.optimizer.value, overrides: form.overrides.value,
      seed: form.seed.value, ...declaredValues(),
      optimizer_options: Object.fromEntries([...form.querySelectorAll("input[data-option]")].map((i) => [i.dataset.option, i.value]).filter(([, v]) => v.trim())),
    };
    const button = document.getElementById("start");
    button.disabled = true; button.textContent = "Checking and starting...";
    try {
      const answer = await api("/api/runs", { method: "POST", body });
      location.href = answer.url;
    } catch (err) {
      showErrors((err.data && err.data.errors) || { form: err.message });
      button.disabled = false; button.textContent = "Start run";
    }
  });

  (async () => {
    choices = await api("/api/form");
    form.task.replaceChildren(...choices.tasks.map((t) => el("option", { value: t.name }, t.name)));
    form.task.value = choices.tasks.some((t) => t.name === "task1a") ? "task1a" : choices.tasks[0].name;
    form.optimizer.replaceChildren(...choices.optimizers.map((o) => el("option", { value: o.name }, o.name)));
    form.where.replaceChildren(...choices.where.map((w) => el("option", { value: w.key }, w.label)));
    document.getElementById("declared-options").replaceChildren(...choices.options.filter((o) => !o.own_field).flatMap(declaredField));
    form.task.addEventListener("change", showTask);
    form.optimizer.addEventListener("change", showOptions);
    showTask();
    showOptions();
    document.body.dataset.ready = "1";
  })();
})();
