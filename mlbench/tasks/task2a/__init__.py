"""Task 2a: linear learning, L2 logistic regression on epsilon (docs/tasks.md).

Trained by the classification runtime it shares with task 1a
(:mod:`mlbench.tasks.classification_runtime`), whose logistic loss has a closed-form gradient.
"""

from mlbench.tasks.classification import ClassificationSettings, LRSchedule
from mlbench.tasks.spec import TaskSpec

TASK2A = TaskSpec(
    name="task2a",
    title="Linear learning: L2 logistic regression on epsilon",
    settings=ClassificationSettings(
        model="logreg",
        dataset="epsilon",
        loss="logistic",
        batch_per_worker=100,
        lr=LRSchedule(kind="inverse-sqrt",
                      alpha_by_workers=((1, 200.0), (2, 400.0), (4, 600.0), (8, 700.0), (16, 800.0))),
        momentum=0.0,
        nesterov=False,
        weight_decay=0.0,
        l2=0.0000025,
        max_epochs=10,
    ),
    goal_full=0.89,
    goal_light=0.80,
    notes="max_epochs is not fixed by the specification; 10 epochs is mlbench's cap",
    reference="PASCAL 2008 large-scale challenge (epsilon); MLBench task 2a",
    sample_unit="examples",
)

#: What the registry reads: the spec, and the module whose ``build_runtime`` the workers call.
SPEC = TASK2A
RUNTIME_MODULE = "mlbench.tasks.classification_runtime"
