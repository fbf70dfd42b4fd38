"""What each distributed optimizer is, without torch: name, division, summary, reference and
``--opt`` options, checked here.

The CLI, the dashboard's form and ``mlbench optimizers`` need only this, and a run is validated
before any worker starts; importing the implementations (and torch, seconds on a small machine)
is left to the worker. Each implementation class in :mod:`mlbench.optim` names its descriptor
(``info = INFO["centralized-sgd"]``). :data:`ORDER` is the
order in which ``mlbench optimizers`` and docs/optimizers.md list them: the reference first, then the
other all-reduce methods, then the compressing and decentralized ones, then the plain-PyTorch
baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlbench.errors import UsageError, about_option

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    """One ``--opt KEY=VALUE`` of an optimizer: its type ("int", "float", "bool", "choice",
    "text"), default, bounds and help.

    ``applies_with`` ``(OTHER, VALUE)``: the option means something only while option OTHER is
    VALUE (AdamW's rate scale while the inner optimizer is AdamW). Otherwise it is left out of
    the parsed options, and given, it is refused: it would change nothing a run computes yet
    make its runs a family of their own. ``replaced_by`` OTHER: likewise, the option means
    nothing once option OTHER is set (a rate scale beside an absolute rate ``lr``)."""

    help: str
    default: Any
    kind: str = "text"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    applies_with: tuple[str, Any] | None = None
    replaced_by: str | None = None

    def parse(self, key: str, raw: str) -> Any:
        raw = raw.strip()
        if self.kind == "bool":
            if raw.lower() in _TRUE + _FALSE:
                return raw.lower() in _TRUE
            raise UsageError(f"option {key}={raw}: expected true or false")
        if self.kind == "choice":
            if raw not in self.choices:
                raise UsageError(f"option {key}={raw}: expected one of {', '.join(self.choices)}")
            return raw
        if self.kind in ("int", "float"):
            try:
                value: Any = int(raw) if self.kind == "int" else float(raw)
            except ValueError:
                expected = "an integer" if self.kind == "int" else "a number"
                raise UsageError(f"option {key}={raw}: expected {expected}") from None
            if not math.isfinite(value) or (self.minimum is not None and value < self.minimum) \
                    or (self.maximum is not None and value > self.maximum):
                raise UsageError(f"option {key}={raw}: expected a value in "
                                 f"[{_bound(self.minimum)}, {_bound(self.maximum)}]")
            return value
        if not raw:
            raise UsageError(f"option {key} needs a value")
        return raw


def _bound(value: float | None) -> str:
    return "inf" if value is None else f"{value:g}"


#: How an optimizer's messages travel, as ``mlbench predict`` prices them (docs/predict.md):
#: ``allreduce``, a ring all-reduce (reduce-scatter then all-gather: FSDP's pair costs the same);
#: ``allgather``, a ring all-gather of each rank's share; ``gossip``, to a fixed set of peers.
COLLECTIVES = ("allreduce", "allgather", "gossip")
#: What an optimizer's communication can run beside (``OptimizerInfo.overlaps``).
OVERLAPS = (None, "backward", "inner-steps")


@dataclass(frozen=True)
class OptimizerInfo:
    """One optimizer as the CLI knows it. ``supports_grad_hook``: whether every rank holds the
    averaged gradient before its update (what gradient clipping and fp16 unscaling need).
    ``local_updates``: each rank updates from its own gradient between synchronisations (the
    DiLoCo family's inner steps); a task's gradient hook (clipping, fp16 unscaling) then runs on
    that gradient, as those methods' inner loops do.
    ``check``: checks across options or against the worker count (None: none).

    What the optimizer claims, which ``mlbench check-optimizer`` (:mod:`mlbench.checks.optimizer`)
    holds it to, as a bool or a function of the parsed options: ``exact``, that k workers with
    batch b compute the parameters of one process with batch k*b (up to float rounding);
    ``ranks_differ``, that the ranks' models differ between synchronisations by design (local
    steps, gossip), so that only their consensus distance is reported and evaluation must see
    their average (``state_for_eval``). Unless it says so, a method claims neither: every rank
    must then hold the same parameters after every step.

    ``period``: the steps from one of the method's communications to the next, so that the
    checker trains over at least two of them and asks for bytes on the wire in each; a number
    (1: every step), or the name of the int option that holds it (``"H"`` for DiLoCo's rounds).
    None: not declared; the checker then asks for bytes over the whole run only.

    ``collective``: how its messages travel, one of :data:`COLLECTIVES`, which
    ``mlbench predict`` (:mod:`mlbench.results.predict`) prices at any number of workers from
    the bytes and collectives a run of it measured.

    ``overlaps``: what its communication runs beside, which ``mlbench predict`` hides from the
    step time: None (nothing: every collective is waited for where it is issued), ``"backward"``
    (each bucket's all-reduce starts once the backward pass has made it: DDP; the last waits),
    or ``"inner-steps"`` (each collective runs beside the inner steps its option ``overlap``
    counts: Streaming DiLoCo's tau).
    """

    name: str
    reference: str
    summary: str
    options: dict[str, Option] = field(default_factory=dict)
    supports_grad_hook: bool = False
    check: Callable[[dict[str, Any], int], None] | None = None
    exact: bool | Callable[[dict[str, Any]], bool] = False
    ranks_differ: bool | Callable[[dict[str, Any]], bool] = False
    local_updates: bool = False
    period: int | str | None = None
    collective: str = "allreduce"
    overlaps: str | None = None

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(f"optimizer {self.name}: collective {self.collective!r} is not one of "
                             f"{', '.join(COLLECTIVES)}")
        if self.overlaps not in OVERLAPS:
            raise ValueError(f"optimizer {self.name}: overlaps {self.overlaps!r} is not one of "
                             f"{', '.join(map(str, OVERLAPS))}")
        if self.overlaps == "inner-steps" and "overlap" not in self.options:
            raise ValueError(f"optimizer {self.name} overlaps inner steps but has no option overlap to count them")

    @property
    def takes_grad_hook(self) -> bool:
        """Whether a task's gradient hook (clipping, fp16 unscaling) runs before every update."""
        return self.supports_grad_hook or self.local_updates

    def claims_exact(self, values: dict[str, Any]) -> bool:
        """Whether, with the parsed options ``values``, k workers equal one process with batch k*b."""
        return bool(self.exact(values) if callable(self.exact) else self.exact)

    def claims_ranks_differ(self, values: dict[str, Any]) -> bool:
        """Whether, with the parsed options ``values``, the ranks' models may differ after a step."""
        return bool(self.ranks_differ(values) if callable(self.ranks_differ) else self.ranks_differ)

    def communication_period(self, values: dict[str, Any]) -> int | None:
        """Steps between two communications with the parsed options ``values`` (None: not declared)."""
        if self.period is None:
            return None
        return max(1, int(values[self.period] if isinstance(self.period, str) else self.period))

    def parse_options(self, raw: dict[str, str], world_size: int | None, *, strict: bool = True) -> dict[str, Any]:
        """Typed options (defaults filled in, those that apply to nothing left out), or a
        UsageError naming the wrong one.

        ``world_size`` None skips the checks that depend on the number of workers; ``strict``
        False drops a given option that applies to nothing instead of refusing it (a recorded
        run, read back).
        """
        unknown = sorted(set(raw) - set(self.options))
        if unknown:
            valid = ", ".join(self.options) or "none"
            raise UsageError(f"optimizer {self.name} has no option {', '.join(unknown)}; "
                             f"valid options: {valid}", option="optimizer_options")
        values = {key: opt.default for key, opt in self.options.items()}
        for key, text in raw.items():
            try:
                values[key] = self.options[key].parse(key, text)
            except UsageError as err:
                raise about_option(err, f"optimizer_options.{key}") from None
        for key, opt in self.options.items():
            if opt.applies_with is None or values[opt.applies_with[0]] == opt.applies_with[1]:
                continue
            other, value = opt.applies_with
            if key in raw and strict:
                raise UsageError(f"optimizer {self.name}: option {key} applies with {other}={value} only; with "
                                 f"{other}={values[other]} it changes nothing, leave it out",
                                 option=f"optimizer_options.{key}")
            del values[key]
        for key, opt in self.options.items():
            if opt.replaced_by is None or key not in values or values.get(opt.replaced_by) is None:
                continue
            if key in raw and strict:
                raise UsageError(f"optimizer {self.name}: option {key} changes nothing once {opt.replaced_by} is "
                                 f"set ({opt.replaced_by}={values[opt.replaced_by]:g}); give one of them",
                                 option=f"optimizer_options.{key}")
            del values[key]
        if self.check is not None and world_size is not None:
            self.check(values, world_size)
        return values


def _check_topology(values: dict[str, Any], world_size: int) -> None:
    from mlbench.optim.topology import parse_topology  # torch-free: the mixing matrix is not built

    try:
        parse_topology(values["topology"], world_size)
    except UsageError as err:
        raise about_option(err, "optimizer_options.topology") from None


def _check_streaming(values: dict[str, Any], world_size: int) -> None:
    h, fragments, overlap = values["H"], values["fragments"], values["overlap"]
    if h % fragments:
        raise UsageError(f"option H={h}: it must be a multiple of fragments={fragments} (one fragment "
                         "every H/fragments steps)", option="optimizer_options.H")
    if overlap >= h // fragments:
        raise UsageError(f"option overlap={overlap}: it must be below H/fragments = {h // fragments}, so that "
                         "a fragment's sync lands before the next one starts", option="optimizer_options.overlap")


#: The inner loop of the DiLoCo family (their papers' inner optimizer: AdamW, weight decay 0.1).
INNER = {
    "H": Option("inner steps per round: each worker's own steps between two synchronisations", 10,
                kind="int", minimum=1),
    "inner": Option("the inner optimizer: adamw, or sgd (the task's SGD: its rate, momentum and weight decay)",
                    "adamw", kind="choice", choices=("adamw", "sgd")),
    "inner_lr_scale": Option("inner=adamw: AdamW's rate = the task's rate x inner_lr_scale", 0.08,
                             kind="float", minimum=0.0, applies_with=("inner", "adamw"), replaced_by="inner_lr"),
    "inner_lr": Option("inner=adamw: AdamW's peak rate, absolute (the task's schedule's shape with this peak; "
                       "unset: the task's rate x inner_lr_scale)", None, kind="float", minimum=0.0,
                       applies_with=("inner", "adamw")),
    "inner_weight_decay": Option("inner=adamw: AdamW's decoupled weight decay", 0.1, kind="float",
                                 minimum=0.0, applies_with=("inner", "adamw")),
}
#: DiLoCo's outer optimizer: SGD with Nesterov momentum on the averaged pseudo-gradient.
OUTER = {
    "outer_lr": Option("the outer SGD's learning rate", 0.7, kind="float", minimum=0.0),
    "outer_momentum": Option("the outer SGD's Nesterov momentum", 0.9, kind="float", minimum=0.0, maximum=1.0),
}

#: An absolute peak rate in place of a scale of the task's (Hyper.rate_factor).
ABSOLUTE_LR = Option("the peak rate, absolute: the task's schedule's shape (warm-up, decays) with this peak, "
                     "the same on every task (unset: the task's rate x lr_scale)", None, kind="float", minimum=0.0)

BY = Option("model (one all-reduce of all tensors) or layer (one all-reduce per tensor)", "model",
            kind="choice", choices=("model", "layer"))

_ALL = (
    OptimizerInfo(
        "centralized-sgd",
        "Synchronous SGD with gradient all-reduce (Goyal et al. 2017; MLBench task 1a)",
        "The reference: average the gradients with an all-reduce, then the same SGD step everywhere.",
        options={"by": BY}, supports_grad_hook=True, exact=True, period=1),
    OptimizerInfo(
        "centralized-adam",
        "Adam (Kingma & Ba 2015, arXiv:1412.6980) on all-reduced gradients, as the original "
        "MLBench's CentralizedAdam",
        "Average the gradients with an all-reduce, then the same Adam step everywhere.",
        options={
            "by": BY,
            "lr_scale": Option("Adam's rate = the task's rate x lr_scale (Adam wants ~1e-3, not SGD's 0.1)",
                               0.08, kind="float", minimum=0.0, replaced_by="lr"),
            "lr": ABSOLUTE_LR,
            "beta1": Option("first-moment decay", 0.9, kind="float", minimum=0.0, maximum=1.0),
            "beta2": Option("second-moment decay", 0.999, kind="float", minimum=0.0, maximum=1.0),
            "eps": Option("denominator term", 1e-8, kind="float", minimum=0.0),
        },
        supports_grad_hook=True, exact=True, period=1),
    OptimizerInfo(
        "centralized-adamw",
        "AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101) on all-reduced gradients, as llm.c and "
        "nanoGPT train GPT-2 (task 5a's reference)",
        "Average the gradients with an all-reduce, then the same AdamW step everywhere, with decoupled weight "
        "decay on the matrices.",
        options={
            "by": BY,
            "lr_scale": Option("AdamW's rate = the task's rate x lr_scale (task 5a's own rate is AdamW's: 1 there)",
                               0.08, kind="float", minimum=0.0, replaced_by="lr"),
            "lr": ABSOLUTE_LR,
            "beta1": Option("first-moment decay", 0.9, kind="float", minimum=0.0, maximum=1.0),
            "beta2": Option("second-moment decay", 0.999, kind="float", minimum=0.0, maximum=1.0),
            "eps": Option("denominator term", 1e-8, kind="float", minimum=0.0),
            "decay": Option("which parameters the task's weight decay applies to: matrices (every tensor of two "
                            "or more dimensions, as llm.c and nanoGPT) or all", "matrices",
                            kind="choice", choices=("matrices", "all")),
        },
        supports_grad_hook=True, exact=True, period=1),
    OptimizerInfo(
        "fsdp",
        "Fully sharded data parallelism: PyTorch's fully_shard (FSDP2; Zhao et al. 2023, arXiv:2304.11277), "
        "ZeRO stage 3 (Rajbhandari et al. 2020, arXiv:1910.02054)",
        "Shard the weights, gradients and optimizer state over the workers: all-gather a block's weights for its "
        "forward and backward, reduce-scatter its gradients, then the task's reference update on each shard.",
        options={"reshard": Option("free a block's gathered weights after its forward and gather them again for "
                                   "its backward (ZeRO-3); false keeps them (ZeRO-2's traffic, more memory)",
                                   True, kind="bool")},
        supports_grad_hook=True, exact=True, period=1),
    OptimizerInfo(
        "model-averaging",
        "Model averaging / local SGD (Stich 2019, arXiv:1805.09767; Lin et al. 2020, "
        "arXiv:1808.07217); the original's agg_grad=False",
        "A local SGD step on each worker, then the weights are averaged (every `period` steps).",
        options={
            "by": BY,
            "period": Option("average the weights every this many steps (1: after every step)", 1,
                             kind="int", minimum=1),
        },
        ranks_differ=lambda values: values["period"] > 1, local_updates=True, period="period"),
    OptimizerInfo(
        "powersgd",
        "Vogels, Karimireddy & Jaggi 2019, PowerSGD: Practical Low-Rank Gradient "
        "Compression for Distributed Optimization (NeurIPS, arXiv:1905.13727)",
        "Rank-r compression of each gradient matrix by power iteration, with error feedback and warm start.",
        options={
            "rank": Option("rank r of the approximation of each gradient matrix", 2, kind="int", minimum=1),
            "warm_start": Option("reuse Q from the previous step (else draw a new one each step)", True,
                                 kind="bool"),
            "error_feedback": Option("add what compression lost to the next step's gradient", True,
                                     kind="bool"),
        },
        supports_grad_hook=True, period=1),
    OptimizerInfo(
        "signsgd",
        "Bernstein et al. 2018, signSGD with Majority Vote (ICLR 2019, arXiv:1810.05291); "
        "error feedback: Karimireddy et al. 2019 (ICML, arXiv:1901.09847)",
        "Each worker sends the signs of its momentum (1 bit each); the update is the majority vote.",
        options={
            "error_feedback": Option("EF-SignSGD: scaled signs with an error memory, averaged instead of voted",
                                     False, kind="bool"),
            "lr_scale": Option("majority vote only: step = the task's rate x lr_scale per coordinate", 0.01,
                               kind="float", minimum=0.0, replaced_by="lr"),
            "lr": Option("majority vote only: the step's peak, absolute (the task's schedule's shape with this "
                         "peak; unset: the task's rate x lr_scale)", None, kind="float", minimum=0.0),
        },
        period=1, collective="allgather"),
    OptimizerInfo(
        "sparsified-sgd",
        "Stich, Cordonnier & Jaggi 2018, Sparsified SGD with Memory (NeurIPS, arXiv:1809.07599)",
        "Each worker sends its k largest (or k random) coordinates; the rest waits in a memory.",
        options={
            "method": Option("topk (largest magnitudes) or randomk", "topk", kind="choice",
                             choices=("topk", "randomk")),
            "ratio": Option("fraction of the coordinates sent per step (k = ratio x d, at least 1)", 0.01,
                            kind="float", minimum=1e-9, maximum=1.0),
            "seed": Option("seed of the random-k draws (each rank adds its rank)", 0, kind="int", minimum=0),
        },
        period=1, collective="allgather"),
    OptimizerInfo(
        "decentralized-sgd",
        "Lian et al. 2017, Can Decentralized Algorithms Outperform Centralized Algorithms? "
        "(NeurIPS, arXiv:1705.09056); Koloskova et al. 2020 (ICML, arXiv:2003.10422)",
        "A local SGD step, then gossip averaging of the weights with the neighbours of a topology.",
        options={
            "topology": Option("ring, torus, torus:RxC, complete, or edges like 0-1,1-2,2-0 "
                               "(Metropolis-Hastings weights)", "ring"),
        },
        check=_check_topology, ranks_differ=True, period=1, collective="gossip"),
    OptimizerInfo(
        "diloco",
        "Douillard et al. 2023, DiLoCo: Distributed Low-Communication Training of Language Models "
        "(arXiv:2311.08105), Algorithm 1",
        "H local steps of an inner optimizer, then one all-reduce of the pseudo-gradient and an outer "
        "Nesterov step.",
        options={**INNER, **OUTER},
        local_updates=True, ranks_differ=lambda values: values["H"] > 1, period="H"),
    OptimizerInfo(
        "streaming-diloco",
        "Douillard et al. 2025, Streaming DiLoCo with overlapping communication: Towards a Distributed "
        "Free Lunch (arXiv:2501.18512)",
        "DiLoCo in fragments synchronised in turn, each all-reduce overlapped with the next inner steps, "
        "optionally in 16 bits.",
        options={
            **INNER, **OUTER,
            "fragments": Option("fragments of the model, synchronised in turn: one every H/fragments steps",
                                2, kind="int", minimum=1),
            "pattern": Option("sequential (the flattened model cut into equal pieces) or strided (tensor i "
                              "in fragment i mod fragments: the paper's layer pattern; needs as many tensors)",
                              "sequential", kind="choice", choices=("sequential", "strided")),
            "overlap": Option("inner steps a fragment's all-reduce runs beside (tau; 0: wait at once)", 1,
                              kind="int", minimum=0),
            "alpha": Option("merge: share of the worker's own parameters when a fragment's sync lands "
                            "(0: take the global ones)", 0.5, kind="float", minimum=0.0, maximum=1.0),
            "outer_dtype": Option("precision of the all-reduced pseudo-gradients (fp32, bf16 or fp16; "
                                  "the outer step is in fp32)", "fp32", kind="choice",
                                  choices=("fp32", "bf16", "fp16")),
        },
        check=_check_streaming, local_updates=True, ranks_differ=True, period="H", overlaps="inner-steps"),
    OptimizerInfo(
        "sparseloco",
        "Sarfi, Therien, Lidin & Belilovsky 2025, Communication Efficient LLM Pre-training with SparseLoCo "
        "(arXiv:2508.15706)",
        "DiLoCo whose pseudo-gradients pass through error feedback and a top-k per chunk; the sparse "
        "updates are all-gathered.",
        options={
            **INNER,
            "outer_lr": Option("outer learning rate (plain averaged step: the error feedback stands in for "
                               "the outer momentum)", 1.0, kind="float", minimum=0.0),
            "ef_decay": Option("beta: the error-feedback memory's decay", 0.95, kind="float", minimum=0.0,
                               maximum=1.0),
            "density": Option("fraction of each chunk's entries sent per round (k = density x chunk, at "
                              "least 1)", 0.02, kind="float", minimum=1e-9, maximum=1.0),
            "chunk": Option("entries per chunk of the flattened model", 4096, kind="int", minimum=1),
        },
        local_updates=True, ranks_differ=lambda values: values["H"] > 1, period="H", collective="allgather"),
    OptimizerInfo(
        "ddp",
        "PyTorch DistributedDataParallel (Li et al. 2020, VLDB, arXiv:2006.15704); "
        "hooks: torch.distributed.algorithms.ddp_comm_hooks",
        "torch's DistributedDataParallel: bucketed all-reduce overlapped with the backward pass.",
        options={
            "hook": Option("allreduce (DDP's own), fp16, bf16 (compressed all-reduce) or powersgd", "allreduce",
                           kind="choice", choices=("allreduce", "fp16", "bf16", "powersgd")),
            "rank": Option("hook=powersgd: rank of the approximation", 2, kind="int", minimum=1),
            "start_iter": Option("hook=powersgd: steps of vanilla all-reduce before compressing", 2,
                                 kind="int", minimum=2),
            "bucket_mb": Option("size of DDP's gradient buckets (MB)", 25.0, kind="float", minimum=0.0),
            "broadcast_buffers": Option("broadcast rank 0's buffers before each forward (DDP's default)", True,
                                        kind="bool"),
        },
        supports_grad_hook=True, exact=lambda values: values["hook"] == "allreduce", period=1, overlaps="backward"),
)

#: Every optimizer by name, in :data:`ORDER`.
INFO: dict[str, OptimizerInfo] = {info.name: info for info in _ALL}
ORDER = tuple(INFO)

#: The closed division's optimizer (docs/tasks.md, "Algorithm").
REFERENCE_OPTIMIZER = "centralized-sgd"


def optimizer_info(name: str) -> OptimizerInfo:
    """The optimizer ``name``, or a UsageError listing the ones there are."""
    try:
        return INFO[name]
    except KeyError:
        raise UsageError(f"unknown optimizer {name!r}; choose one of: {', '.join(sorted(INFO))} "
                         "(see `mlbench optimizers`)", option="optimizer") from None


def check_optimizer(name: str, options: dict[str, str], world_size: int | None = None) -> OptimizerInfo:
    """The optimizer ``name``, after checking that it exists and takes ``options`` (and, given
    ``world_size``, that they fit that many workers)."""
    info = optimizer_info(name)
    info.parse_options(options, world_size)
    return info


def with_grad_hook() -> list[str]:
    """The optimizers that run a task's gradient hook: their ranks hold the averaged gradient
    before the update, or update from their own gradient (``local_updates``)."""
    return sorted(name for name, info in INFO.items() if info.takes_grad_hook)


def describe_optimizers(references: dict[str, str]) -> list[dict[str, Any]]:
    """Every optimizer with its division, summary, reference and options (for the CLI and
    docs/optimizers.md); ``references``: each task's reference optimizer, by task (the task
    registry's ``reference_optimizers``: this layer knows no task)."""
    return [describe(info, references) for info in _ALL]


def describe(info: OptimizerInfo, references: dict[str, str]) -> dict[str, Any]:
    """One optimizer's division, summary, reference and options (a built-in or a plug-in);
    ``reference_of``: the tasks whose closed division it is, from ``references`` (task ->
    its reference optimizer)."""
    tasks = [task for task, name in references.items() if name == info.name]
    return {"name": info.name, "closed_division": bool(tasks), "reference_of": tasks, "summary": info.summary,
            "reference": info.reference,
            "options": [{"name": key, "default": opt.default, "help": opt.help}
                        for key, opt in info.options.items()]}
