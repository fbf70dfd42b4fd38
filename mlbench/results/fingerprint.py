"""A run's fingerprint: every setting that changes what it computes, as ``key -> text``.

Two runs are repeats of one configuration only when their fingerprints are equal: then only the
seed and the settings that watch a run (its name, how often it logs, the watchdog) may differ.
`compare` groups runs into families by fingerprint (less the worker count, which a family's rows
vary), shows above its tables which keys differ between the families it shows (as W&B's run
comparer shows a configuration diff), and pools across a key only when asked (``--pool KEY``).

The fingerprint is made from run.json alone, so it is the same for every surface and for runs of
any launcher: the fields of :class:`~mlbench.run_config.RunConfig` whose role is
:data:`~mlbench.run_config.COMPUTES` (:data:`~mlbench.run_config.CONFIG_ROLES`, which a test
holds to the fields), the task's settings after ``--set``, the optimizer's options with their
defaults, every plug-in's source hash, the data's identity (run.json's ``data``:
:mod:`mlbench.tasks.data.identity`), the emulated network, the fault schedule and recovery
policy, whether the run was resumed, and the hardware it ran on.
"""

from __future__ import annotations

import json
from typing import Any

from mlbench.errors import UsageError
from mlbench.network.settings import network_label
from mlbench.optim.descriptors import INFO
from mlbench.run_config import CONFIG_ROLES, COMPUTES, RunConfig, RunDocument
from mlbench.tasks.records import spec_to_dict

#: Fingerprint keys that are not config fields, and what each says (for `--pool` and the docs).
DERIVED_KEYS = {
    "data": "the data's identity: its data set, whether official, and the hash of its files",
    "stop": "the stop rule: goal (full or light), --no-stop, --time-budget, --max-steps",
    "checkpoint_every": "the checkpoint interval",
    "network": "the emulated network (bandwidth, latency, jitter, loss, shaping)",
    "faults": "the --inject schedules and the --on-failure policy",
    "resumed": "whether the run was resumed from a checkpoint",
    "hardware": "what a worker ran on (GPU model, or CPU model and cores)",
}

#: Config fields that enter the fingerprint through a derived key, not by name.
_FOLDED = {"light", "stop_at_goal", "time_budget_s", "max_steps", "checkpoint_every_s", "checkpoint_every_steps",
           "checkpoint_auto_mtbf_s", "faults", "on_failure", "max_restarts", "optimizer_options", "optimizer_plugin",
           "model_plugin", "task"}

#: Spec fields that describe the task rather than set what it computes.
_SPEC_TEXT = {"name", "title", "notes", "reference", "sample_unit", "kind"}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "-" if value is None else str(value)


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = _text(value)


def stop_rule(config: RunConfig) -> str:
    """How the run stops: ``goal 80%`` is the task's rule; ``no-stop``, a time budget and a step
    cap are other rules (a time-budget run is "accuracy after time", never a time to accuracy)."""
    parts = []
    if config.data == "synthetic":
        parts.append("no goal (synthetic data)")
    else:
        parts.append(f"{'light' if config.light else 'full'} goal" + ("" if config.stop_at_goal else ", no-stop"))
    if config.time_budget_s is not None:
        parts.append(f"time budget {config.time_budget_s:g}s")
    if config.max_steps is not None:
        parts.append(f"max {config.max_steps} steps")
    return ", ".join(parts)


def checkpoint_text(config: RunConfig) -> str:
    if config.checkpoint_every_steps is not None:
        return f"every {config.checkpoint_every_steps} steps"
    if config.checkpoint_every_s is not None:
        return f"every {config.checkpoint_every_s:g}s"
    if config.checkpoint_auto_mtbf_s is not None:
        return f"auto (Young/Daly, MTBF {config.checkpoint_auto_mtbf_s:g}s)"
    return "none"


def data_text(document: RunDocument) -> str:
    """The data's identity in a few words: ``synthetic``; ``epsilon (official) 1a2b3c4d5e6f``;
    ``custom: 3,000 training rows, not epsilon's 400,000 (sha 9f8e...)``; a run.json from before
    identities were recorded: its folder."""
    config = document.config
    if config.data == "synthetic":
        return "synthetic"
    identity = document.extra.get("data")
    if isinstance(identity, dict) and identity.get("sha256"):
        sha = str(identity["sha256"])[:12]
        if identity.get("official"):
            return f"{identity.get('dataset')} (official) {sha}"
        return f"custom: {identity.get('reason') or 'not the official files'} ({sha})"
    return f"not recorded ({config.data_dir or 'the cache'})"


def optimizer_settings(config: RunConfig) -> dict[str, str]:
    """``opt.KEY`` for every option of the run's optimizer, defaults filled in, so that
    ``--opt period=1`` given and left at its default are the same setting, and ``period=8`` is
    another; a plug-in adds its source hash."""
    out: dict[str, str] = {}
    plugin = config.optimizer_plugin
    if plugin:
        out["optimizer.sha256"] = str(plugin.get("sha256", ""))[:12]
        options = plugin.get("options") or config.optimizer_options
    else:
        options = dict(config.optimizer_options)
        info = INFO.get(config.optimizer)
        try:
            if info is not None:
                options = info.parse_options(dict(config.optimizer_options), None, strict=False)
        except UsageError:  # an option of an older mlbench: the text as it was given
            pass
    for key, value in sorted(options.items()):
        out[f"opt.{key}"] = _text(value)
    return out


def run_fingerprint(document: RunDocument, hardware: str, faults: str = "") -> dict[str, str]:
    """The run's fingerprint (``key -> text``, keys sorted). ``hardware``: what compare calls
    the machine (:func:`mlbench.results.compare.hardware_label`); ``faults``: its fault setting
    (:func:`mlbench.results.goodput.fault_setting`)."""
    config = document.config
    out: dict[str, str] = {}
    for name, role in CONFIG_ROLES.items():
        if role == COMPUTES and name not in _FOLDED:
            out[name] = _text(getattr(config, name))
    spec = spec_to_dict(config.task)
    for key, value in spec.items():
        if key not in _SPEC_TEXT:
            _flat(f"set.{key}" if key != "settings" else "set", value, out)
    out.update(optimizer_settings(config))
    if config.model_plugin:
        out["model.sha256"] = str(config.model_plugin.get("sha256", ""))[:12]
    out["data"] = data_text(document)
    out["stop"] = stop_rule(config)
    out["checkpoint_every"] = checkpoint_text(config)
    out["network"] = network_label(document.extra.get("network")) or "not emulated"
    out["faults"] = faults or "none"
    out["resumed"] = "yes" if document.resumes else "no"
    out["hardware"] = hardware
    return dict(sorted(out.items()))


#: Fingerprint keys that headings and legends name in their own words (the optimizer, the
#: hardware, ...): the keys said as ``key value`` are the others.
NAMED_KEYS = ("optimizer", "hardware", "network", "faults", "framework", "model.sha256")


def differing_keys(fingerprints: list[dict[str, str]]) -> list[str]:
    """The keys whose values are not the same in every fingerprint (a key one lacks differs)."""
    keys = sorted({key for fp in fingerprints for key in fp})
    return [key for key in keys if len({fp.get(key, "-") for fp in fingerprints}) > 1]


def follows_optimizer(key: str, fingerprints: list[dict[str, str]]) -> bool:
    """Whether ``key`` is an optimizer option whose value is one per optimizer among
    ``fingerprints``: it differs only because the optimizers do (each has its own options), so
    naming the optimizers says it."""
    if not key.startswith("opt."):
        return False
    values: dict[str, set[str]] = {}
    for fp in fingerprints:
        values.setdefault(fp.get("optimizer", "-"), set()).add(fp.get(key, "-"))
    return len(values) > 1 and all(len(v) == 1 for v in values.values())


def pool_matches(key: str, pooled: tuple[str, ...]) -> bool:
    """Whether fingerprint ``key`` is pooled by one of ``pooled`` (a key, or a prefix ending in
    a dot: ``set.`` pools every task setting, ``opt.`` every optimizer option)."""
    return any(key == p or (p.endswith(".") and key.startswith(p)) or key.startswith(p + ".") for p in pooled)
