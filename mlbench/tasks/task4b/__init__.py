"""Task 4b: machine translation, the Transformer (big) on WMT17 en-de (docs/tasks.md).

The numbers are :class:`.settings.TranslationSettings`; the worker side is :mod:`.runtime`
(with :mod:`.beam_search` and :mod:`.bleu` for the evaluation).
"""

from mlbench.tasks.spec import TaskSpec
from mlbench.tasks.task4b.settings import TranslationSettings

TASK4B = TaskSpec(
    name="task4b",
    title="Machine translation: Transformer (big) on WMT17 en-de",
    settings=TranslationSettings(),
    goal_full=25.0,
    goal_light=20.0,
    metric="bleu",
    optimizer="centralized-adam",
    notes="batch_per_worker counts tokens; BLEU on newstest2014 (sacreBLEU), beam 4, length penalty 0.6",
    reference="Vaswani et al. 2017 (Transformer big, pre-norm); MLBench task 4b",
    sample_unit="target tokens",
)

#: What the registry reads: the spec, and the module whose ``build_runtime`` the workers call.
SPEC = TASK4B
RUNTIME_MODULE = "mlbench.tasks.task4b.runtime"
