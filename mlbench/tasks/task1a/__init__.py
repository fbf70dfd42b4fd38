"""Task 1a: image classification, ResNet-20 on CIFAR-10 (docs/tasks.md).

Trained by the classification runtime it shares with task 2a
(:mod:`mlbench.tasks.classification_runtime`); the models are :mod:`mlbench.tasks.models`'s ResNets.
"""

from mlbench.tasks.classification import ClassificationSettings, LRSchedule
from mlbench.tasks.spec import TaskSpec

TASK1A = TaskSpec(
    name="task1a",
    title="Image classification: ResNet-20 on CIFAR-10",
    settings=ClassificationSettings(
        model="resnet20-v1",
        dataset="cifar10",
        loss="cross-entropy",
        batch_per_worker=32,
        lr=LRSchedule(kind="warmup-multistep", eta_per_sample=0.1 / 256, warmup_epochs=5,
                      milestones=(82, 109), decay_factor=10.0),
        momentum=0.9,
        nesterov=True,
        weight_decay=1e-4,
        l2=0.0,
        max_epochs=164,
    ),
    goal_full=0.80,
    goal_light=0.70,
    reference="He et al. 2015 (ResNet); Goyal et al. 2017 (warm-up); MLBench task 1a",
    sample_unit="images",
)

#: What the registry reads: the spec, and the module whose ``build_runtime`` the workers call.
SPEC = TASK1A
RUNTIME_MODULE = "mlbench.tasks.classification_runtime"
