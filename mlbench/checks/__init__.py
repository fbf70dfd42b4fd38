"""Checks that exercise the library's plug-in points in real processes, above the layers they
check: :mod:`mlbench.checks.optimizer` is ``mlbench check-optimizer``'s test bed (a small MLP,
its data, task 1a's hyper-parameters), which the optimizer layer, knowing no task, cannot hold."""
