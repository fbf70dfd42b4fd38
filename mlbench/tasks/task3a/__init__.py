"""Task 3a: language modelling, AWD-LSTM on Wikitext-2 (docs/tasks.md).

The numbers are :class:`.settings.LanguageModelSettings`; the worker side is :mod:`.runtime`.
"""

from mlbench.tasks.spec import TaskSpec
from mlbench.tasks.task3a.settings import LanguageModelSettings

TASK3A = TaskSpec(
    name="task3a",
    title="Language modelling: AWD-LSTM on Wikitext-2",
    settings=LanguageModelSettings(),
    goal_full=70.0,
    goal_light=90.0,
    metric="perplexity",
    notes="validation perplexity, lower is better; averaged SGD after the non-monotone trigger",
    reference="Merity et al. 2018 (AWD-LSTM, arXiv:1708.02182); MLBench task 3a",
    sample_unit="tokens",
)

#: What the registry reads: the spec, and the module whose ``build_runtime`` the workers call.
SPEC = TASK3A
RUNTIME_MODULE = "mlbench.tasks.task3a.runtime"
