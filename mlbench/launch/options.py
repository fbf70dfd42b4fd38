"""Every option of `mlbench run`, declared once: :data:`RUN_OPTIONS`.

The click options of `mlbench run` (:mod:`mlbench.cli.run_options`), the keywords of
:func:`mlbench.api.plan` and :func:`mlbench.api.run`, the dashboard's new-run form and
docs/cli.md are made from this list; nothing else names an option. Each option says:

- how its value enters a run (:meth:`RunOption.request_fields`: the fields of the
  :class:`~mlbench.launch.plan.RunRequest` it sets, parsed by the library's own parsers), or that
  it shapes the plan (``repeat``, the network's rates: one run each) or how the runs are followed
  (``detach``, ``log_to``);
- its **role**: whether it changes what a run computes (:data:`COMPUTES`: its value is part of
  the run's fingerprint, :mod:`mlbench.results.fingerprint`, so two runs that differ in it are
  never repeats of each other in `compare`), only how the run is watched (:data:`WATCHES`), is the
  one setting repeats differ in (:data:`SEED`), or says how many runs are made (:data:`PLANS`).

A mistake in a value is a :class:`~mlbench.errors.UsageError` whose ``option`` is the option's
name, so that the dashboard's form shows it beside its field without reading the sentence.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mlbench.errors import UsageError, about_option
from mlbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from mlbench.launch.faults import parse_inject, parse_on_failure
from mlbench.launch.plan import BACKENDS, parse_checkpoint_auto, parse_checkpoint_every, parse_duration, parse_watchdog
from mlbench.network.settings import SHAPING
from mlbench.run_config import COMPUTES, PLANS, SEED, WATCHES, Role
from mlbench.tasks.overrides import parse_overrides


#: Where an option's value goes: the run's request, the plan (how many runs), the emulated
#: network of each run (one per rate), or how the runs are followed.
Target = Literal["request", "plan", "network", "follow"]


def _seconds(value: str | float, option: str) -> float:
    """A duration given as text ("10m", "90s") or as seconds."""
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{option} {value!r}: give a duration above 0 seconds (a number, or text like 10m)")
    return float(value)


def pairs(values: Mapping[str, Any] | Sequence[str] | str, option: str) -> list[str]:
    """``{"momentum": 0, "lr.milestones": [50, 75]}`` or ``("momentum=0",)`` as KEY=VALUE pairs
    (what `--set` and `--opt` take on the command line, and the API as a mapping)."""
    def text(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ",".join(text(v) for v in value)
        return str(value)
    if isinstance(values, str):
        return [values]
    if isinstance(values, Mapping):
        return [f"{key}={text(value)}" for key, value in values.items()]
    if not isinstance(values, Sequence):
        raise UsageError(f"{option} {values!r}: give KEY=VALUE pairs or a mapping of KEY to VALUE")
    return [str(pair) for pair in values]


def parse_optimizer_options(values: Mapping[str, Any] | Sequence[str] | str) -> dict[str, str]:
    """``--opt KEY=VALUE`` pairs (or the API's mapping) as a dict of text values; the optimizer
    checks names and values itself."""
    options = {}
    for pair in pairs(values, "--opt"):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--opt {pair!r}: expected KEY=VALUE, e.g. --opt rank=2")
        options[key.strip()] = value.strip()
    return options


def optimizer_names(value: str | Sequence[str] | None) -> list[str]:
    """``--optimizer A,B,C`` (or the API's list) as the names of one run each; [] for none given
    (the task's reference)."""
    if value is None:
        return []
    names: list[Any] = [value] if isinstance(value, str) or not isinstance(value, (list, tuple)) else list(value)
    if not all(isinstance(name, str) for name in names):
        raise about_option(UsageError(f"optimizer={shown(value)}: give a name, a comma list of names or a list "
                                      "of them"), "optimizer")
    split = [part.strip() for name in names for part in name.split(",")]
    if not all(split) or len(set(split)) < len(split):
        raise about_option(UsageError(f"--optimizer {','.join(split)}: give each optimizer once, separated by "
                                      "commas"), "optimizer")
    return split


def options_by_optimizer(names: Sequence[str], options: dict[str, str]) -> list[tuple[str | None, dict[str, str]]]:
    """(name, its ``--opt`` values) of one run each of ``names``: one optimizer takes them all
    (and refuses what it does not take); several take each the ones it declares, and a key that
    none of them declares is a UsageError."""
    if len(names) <= 1:
        return [(name, dict(options)) for name in names]
    declared = {name: set(_declared_options(name)) for name in names}
    unknown = sorted(key for key in options if not any(key in keys for keys in declared.values()))
    if unknown:
        raise about_option(UsageError(f"--opt {', '.join(unknown)}: none of the optimizers {', '.join(names)} "
                                      "has this option (`mlbench optimizers` lists each one's)"),
                           "optimizer_options")
    return [(name, {key: value for key, value in options.items() if key in declared[name]}) for name in names]


def _declared_options(name: str) -> list[str]:
    from mlbench.optim.descriptors import optimizer_info
    from mlbench.optim.plugins import resolve_optimizer

    plugin = resolve_optimizer(name)
    return list((plugin.info if plugin is not None else optimizer_info(name)).options)


def _checkpoint_fields(value: str | None) -> dict[str, Any]:
    auto = parse_checkpoint_auto(value) if value else None
    if auto is not None:   # Young/Daly's interval, from the measured cost and this MTBF (0: the --inject schedule's)
        return {"checkpoint_every_s": None, "checkpoint_every_steps": None, "checkpoint_auto_mtbf_s": auto}
    seconds, steps = parse_checkpoint_every(value) if value else (None, None)
    return {"checkpoint_every_s": seconds, "checkpoint_every_steps": steps, "checkpoint_auto_mtbf_s": None}


def _on_failure_fields(value: str) -> dict[str, Any]:
    policy, restarts = parse_on_failure(value)
    return {"on_failure": policy, "max_restarts": restarts}


def _watchdog_fields(value: str | float | None) -> dict[str, Any]:
    if value is None or isinstance(value, str):
        return {"watchdog_s": parse_watchdog(value) if value is not None else None}
    seconds = _seconds(value, "--watchdog")
    return {"watchdog_s": parse_watchdog(f"{seconds}s")}


def _folder(value: str | os.PathLike[str] | None) -> str | None:
    return None if value is None else str(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: What each type an option's ``annotation`` names admits, and how a refusal names it: the API
#: is given what a script passes, and a value of another type is one line about its keyword.
_ADMITS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "None": (lambda v: v is None, "None"),
    "str": (_is_text, "text"),
    "DataSource": (_is_text, "text"), "Backend": (_is_text, "text"), "Device": (_is_text, "text"),
    "Precision": (_is_text, "text"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "float": (_is_number, "a number"),
    "os.PathLike[str]": (lambda v: isinstance(v, os.PathLike), "a path"),
    "Mapping[str, Any]": (lambda v: isinstance(v, Mapping), "a mapping"),
    "Sequence[str]": (lambda v: isinstance(v, (list, tuple)) and all(isinstance(i, str) for i in v),
                      "a list of texts"),
}


@dataclass(frozen=True)
class RunOption:
    """One option of `mlbench run` and of :func:`mlbench.api.run`.

    ``name`` is the API's keyword and the form's field; ``flag`` the CLI's (a ``negated`` flag
    turns the option off: ``--no-stop`` is ``stop_at_goal=False``); ``kind`` the value's type on
    the command line (``bool`` for a flag), ``annotation`` what the API accepts; ``fields``
    parses the value into the run request's fields (None: the request's field of the option's
    name takes the value as it is); ``needs`` where it applies beyond any run
    (clusters, task 0a), said before its help (:attr:`description`)."""

    name: str
    flag: str
    help: str
    role: Role
    default: Any = None
    kind: type = str
    annotation: str = "str | None"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    multiple: bool = False
    negated: bool = False
    short: str | None = None
    folder: bool = False
    target: Target = "request"
    fields: Callable[[Any], dict[str, Any]] | None = None
    needs: str = ""

    @property
    def is_flag(self) -> bool:
        return self.kind is bool

    @property
    def description(self) -> str:
        """The help as the CLI and the docs show it: what the option needs, then what it does."""
        return f"{self.needs}: {self.help}" if self.needs else self.help

    def request_fields(self, value: Any) -> dict[str, Any]:
        """The run request's fields this option's ``value`` sets (a UsageError about this option
        for a value it cannot take)."""
        try:
            if self.choices is not None and value is not None and value not in self.choices:
                raise UsageError(f"{self.flag} {value}: choose one of {', '.join(self.choices)}")
            if self.kind is int and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"{self.name}={shown(value)}: give a whole number")
            if self.kind is float and value is not None and (isinstance(value, bool)
                                                             or not isinstance(value, (int, float))):
                raise UsageError(f"{self.name}={shown(value)}: give a number")
            if self.kind is bool and not isinstance(value, bool):
                raise UsageError(f"{self.name}={shown(value)}: give True or False")
            if self.multiple and isinstance(value, str):
                value = (value,)   # one KEY=VALUE or fault, as one --set or --inject
            self._check_type(value)
            return self.fields(value) if self.fields is not None else {self.name: value}
        except UsageError as err:
            raise about_option(err, self.name) from None

    def _check_type(self, value: Any) -> None:
        """A value that is none of the types the ``annotation`` names, refused in one line that
        names the keyword and what it takes (``name=3``: give text or None)."""
        kinds = [_ADMITS[part.strip()] for part in self.annotation.split(" | ")]
        if any(admits(value) for admits, _ in kinds):
            return
        wanted = list(dict.fromkeys(words for _, words in kinds))
        said = wanted[0] if len(wanted) == 1 else f"{', '.join(wanted[:-1])} or {wanted[-1]}"
        raise UsageError(f"{self.name}={shown(value)}: give {said}")


def shown(value: Any) -> str:
    """A value as a message of one line shows it: its repr, on one line, at most 60 characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else f"{text[:57]}..."


RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption("light", "--light", "Use the light goal (task1a 70%, task2a 80%).", COMPUTES, False, bool, "bool"),
    RunOption("time_budget", "--time-budget",
              "The goal metric after time: stop training after this much training time (e.g. 10m).", COMPUTES,
              annotation="str | float | None", metavar="DURATION",
              fields=lambda v: {"time_budget_s": None if v is None else _seconds(v, "--time-budget")}),
    RunOption("stop_at_goal", "--no-stop", "Keep training after the goal is reached.", COMPUTES, True, bool,
              "bool", negated=True),
    RunOption("data", "--data", "synthetic: random data of the task's shape, for throughput only (no goal).",
              COMPUTES, "real", annotation="DataSource", choices=("real", "synthetic")),
    RunOption("data_dir", "--data-dir", "Where the data set is (else the cache, downloading it).", COMPUTES,
              annotation="str | os.PathLike[str] | None", folder=True, fields=lambda v: {"data_dir": _folder(v)}),
    RunOption("data_pvc", "--data-pvc",
              "a PersistentVolumeClaim you filled with the data set [mlbench-data-DATASET, filled once by a "
              "download Job].", COMPUTES, metavar="NAME", needs="Clusters"),
    RunOption("model", "--model",
              "Model override, e.g. resnet56-v2, or a plug-in FILE.py:NAME, module:NAME or entry point of "
              "mlbench.models (open division; docs/plugins.md).", COMPUTES),
    RunOption("overrides", "--set", "Override a hyper-parameter, e.g. --set momentum=0 (open division).",
              COMPUTES, annotation="Mapping[str, Any] | Sequence[str] | None", metavar="KEY=VALUE", multiple=True,
              fields=lambda v: {"overrides": parse_overrides(pairs(v or {}, "--set"))}),
    RunOption("optimizer", "--optimizer",
              "Distributed optimizer (`mlbench optimizers`); a comma list makes one run per optimizer [the task's "
              "reference: centralized-sgd; centralized-adam for task4b].", COMPUTES, metavar="NAME[,NAME...]",
              annotation="str | Sequence[str] | None"),
    RunOption("optimizer_options", "--opt",
              "Optimizer option, e.g. --opt by=layer (with several optimizers: each takes the ones it has).",
              COMPUTES,
              annotation="Mapping[str, Any] | Sequence[str] | None", metavar="KEY=VALUE", multiple=True,
              fields=lambda v: {"optimizer_options": parse_optimizer_options(v or {})}),
    RunOption("backend", "--backend",
              "torch.distributed backend [gloo on CPU, nccl on GPUs; gloo when the workers outnumber this "
              "machine's GPUs].", COMPUTES, annotation="Backend | None", choices=BACKENDS),
    RunOption("device", "--device", "[cuda when a GPU is visible, else cpu]", COMPUTES,
              annotation="Device | None", choices=("cpu", "cuda")),
    RunOption("framework", "--framework",
              "Which framework trains: jax needs `pip install 'mlbench-suite[jax]'`, tensorflow `pip install "
              "'mlbench-suite[tensorflow]'`; both run task1a and task2a (docs/worker-contract.md).", COMPUTES,
              DEFAULT_FRAMEWORK, annotation="str", choices=tuple(FRAMEWORKS)),
    RunOption("threads_per_worker", "--threads-per-worker",
              "CPU threads of each worker (torch's intra-op threads) [1 on CPUs, the same for every worker count: "
              "the original's one worker per node; a cluster's pod or Slurm task: its CPUs].", COMPUTES,
              kind=int, annotation="int | None", metavar="N"),
    RunOption("seed", "--seed", "Seed of model init, data order and augmentation.", SEED, 0, int, "int"),
    RunOption("repeat", "--repeat",
              "Run every worker count N times, with seeds SEED..SEED+N-1, in N rounds over the worker counts (so "
              "that load changes hit every count alike).", PLANS, 1, int, "int", metavar="N", target="plan"),
    RunOption("max_steps", "--max-steps", "Stop after this many steps (for quick checks).", COMPUTES, kind=int,
              annotation="int | None"),
    RunOption("log_every", "--log-every", "Record training metrics every N steps.", WATCHES, 50, int, "int"),
    RunOption("timing", "--no-timing", "Do not time the phases of each step.", WATCHES, True, bool, "bool",
              negated=True),
    RunOption("save_model", "--save-model", "Save each worker's final parameters in the run folder.", WATCHES,
              False, bool, "bool"),
    RunOption("precision", "--precision", "bf16: autocast forward on the GPU (open division).", COMPUTES, "fp32",
              annotation="Precision", choices=("fp32", "bf16")),
    RunOption("channels_last", "--channels-last", "Channels-last memory format for images and model.", COMPUTES,
              False, bool, "bool"),
    RunOption("graph", "--no-graph", "Do not capture the GPU step in a CUDA graph.", COMPUTES, True, bool, "bool",
              negated=True),
    RunOption("watchdog", "--watchdog",
              "Fail the run when a worker makes no progress for max(DURATION, 10 x the median step time), naming "
              "it (10 x DURATION before its first step and while it evaluates); off: wait for the collectives' "
              "timeout.", WATCHES, "60s", annotation="str | float | None", metavar="DURATION|off",
              fields=_watchdog_fields),
    RunOption("checkpoint_every", "--checkpoint-every",
              "Write every worker's resumable state this often (2m, 500steps) and at a clean stop (Ctrl-C, "
              "cancel, --max-steps, --time-budget); `mlbench resume RUN` continues from it. auto[:MTBF]: at "
              "Young/Daly's interval from the measured checkpoint cost and the mean time between failures "
              "(MTBF, e.g. auto:2h; auto alone: the --inject schedule's).", COMPUTES,
              metavar="DURATION|Nsteps|auto[:MTBF]", fields=_checkpoint_fields),
    RunOption("checkpoint_dir", "--checkpoint-dir",
              "Keep the checkpoints in DIR/RUN_ID (shared storage) [RUN_DIR/checkpoints].", WATCHES,
              annotation="str | os.PathLike[str] | None", folder=True,
              fields=lambda v: {"checkpoint_dir": _folder(v)}),
    RunOption("inject", "--inject",
              "Inject a fault (repeatable): kill (SIGKILL; on a cluster its pod deleted), stall (SIGSTOP; for=T "
              "then SIGCONT) or slow (a straggler, factor=F) of worker R, or link-down (its emulated link, for=T), "
              "at T, every T or every=rand(A,B),seed=S (docs/faults.md).", COMPUTES,
              annotation="Sequence[str] | None", metavar="KIND:rank=R,at=T|every=T[,...]", multiple=True,
              fields=lambda v: {"faults": [parse_inject(text) for text in v or ()]}),
    RunOption("on_failure", "--on-failure",
              "When a worker dies or the watchdog finds one stalled: fail the run, restart the workers from the "
              "newest valid checkpoint, at most N times [3] (an injected fault after a new checkpoint does "
              "not count), or shrink: go on with the survivors from it, at most N times [until one is left] "
              "(both imply --checkpoint-every 1m unless given; docs/faults.md).", COMPUTES, "fail",
              annotation="str", metavar="fail|restart[:N]|shrink[:N]", fields=_on_failure_fields),
    RunOption("max_size", "--max-size", "largest message, in elements [1e8].", COMPUTES, kind=float,
              annotation="float | None", metavar="N", needs="task0a"),
    RunOption("name", "--name", "A name for the run (default: TASK-Kw-ID).", WATCHES),
    RunOption("detach", "--detach", "Start the run in the background and return at once.", WATCHES, False, bool,
              "bool", short="-d", target="follow"),
    RunOption("log_to", "--log-to",
              "Write each run into tensorboard:DIR, mlflow:DIR or wandb:DIR while it trains, as `mlbench export` "
              "would after it (repeatable; not with --detach).", WATCHES, annotation="Sequence[str] | None",
              metavar="TOOL:DIR", multiple=True, target="follow"),
    RunOption("bandwidth", "--bandwidth",
              "Emulate every worker's link at RATE in each direction (tc units: 100mbit, 1gbit, 10gbit); a comma "
              "list makes one run per rate.", COMPUTES, metavar="RATE[,RATE...]", target="network"),
    RunOption("latency", "--latency", "Emulated one-way latency between workers (5ms, 0.5ms, 500us).", COMPUTES,
              metavar="TIME", target="network"),
    RunOption("jitter", "--jitter", "Vary the latency uniformly by up to +/- TIME.", COMPUTES, metavar="TIME",
              target="network"),
    RunOption("loss", "--loss", "Drop this share of the packets on every path (0.1%).", COMPUTES,
              metavar="PERCENT", target="network"),
    RunOption("shaping", "--shaping",
              "tc from an init container with NET_ADMIN, or the CNI bandwidth plugin's pod annotations (rate "
              "only).", COMPUTES, "tc", annotation="str", choices=SHAPING, target="network", needs="On a cluster"),
)

OPTIONS_BY_NAME: dict[str, RunOption] = {option.name: option for option in RUN_OPTIONS}


def option_defaults() -> dict[str, Any]:
    """Every option's default, by name (what a run is asked with when nothing is said)."""
    return {option.name: option.default for option in RUN_OPTIONS}


def nearest(key: str, names: Iterable[str], otherwise: str) -> str:
    """``; did you mean NAME?`` for the name nearest a misspelt ``key``, else ``; OTHERWISE``."""
    near = difflib.get_close_matches(str(key), list(names), n=1)
    return f"; did you mean {near[0]}?" if near else f"; {otherwise}"


def check_names(given: Mapping[str, Any], where: str = "mlbench.run") -> None:
    """Refuse a keyword that is no option (``time_budgt``), naming the nearest one."""
    for key in given:
        if key not in OPTIONS_BY_NAME:
            hint = nearest(key, OPTIONS_BY_NAME, "the options are mlbench run's (docs/python-api.md)")
            raise about_option(UsageError(f"{where}: no option {key!r}{hint}"), key)


def values_with_defaults(given: Mapping[str, Any], where: str = "mlbench.run") -> dict[str, Any]:
    """``given`` checked for unknown names, with every other option at its default."""
    check_names(given, where)
    return {**option_defaults(), **given}


def checked_value(name: str, values: Mapping[str, Any]) -> Any:
    """The value of option ``name`` of a target other than the request (``repeat``, the
    network's), checked as its declaration says."""
    option = OPTIONS_BY_NAME[name]
    return option.request_fields(values.get(name, option.default))[name]


def request_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The run request's fields from the options' values (every option of target ``request``)."""
    fields: dict[str, Any] = {}
    for option in RUN_OPTIONS:
        if option.target == "request":
            fields.update(option.request_fields(values.get(option.name, option.default)))
    return fields


def api_signature(*leading: inspect.Parameter, trailing: Sequence[inspect.Parameter] = (),
                  skip: Sequence[str] = ()) -> inspect.Signature:
    """The keyword-only signature of a function that takes the options as ``**options``, as
    ``help()`` and editors show it: ``leading`` parameters, every option with its default, then
    ``trailing`` ones."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    options = [inspect.Parameter(o.name, keyword, default=o.default, annotation=o.annotation)
               for o in RUN_OPTIONS if o.name not in skip]
    return inspect.Signature([*leading, *options, *trailing])
