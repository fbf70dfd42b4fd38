"""Task 0a: the all-reduce micro-benchmark of the communication backend (docs/tasks.md).

The sweep's definition (sizes, bandwidth formulas, the table) is :mod:`.sweep`; what each worker
runs is :mod:`.runtime` (``run_benchmark``, not a training runtime: there is no model).
"""

from mlbench.tasks.spec import AllreduceSpec

TASK0A = AllreduceSpec(
    name="task0a",
    title="Communication: all-reduce latency and bandwidth of the backend",
    max_size=10**8,
    dtypes=("fp32", "fp16", "bf16"),
    warmup=5,
    iterations=20,
    seconds_per_size=0.5,
    notes="messages of 1..max_size elements (log-spaced); nccl-tests' time, algbw and busbw per size",
    reference="MLBench task 0a; bandwidths as NVIDIA nccl-tests (doc/PERFORMANCE.md)",
)

#: What the registry reads: the spec, and the module whose ``run_benchmark`` the workers call.
SPEC = TASK0A
RUNTIME_MODULE = "mlbench.tasks.task0a.runtime"
