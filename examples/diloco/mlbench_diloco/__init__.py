"""DiLoCo as an mlbench optimizer plug-in (the entry point ``diloco`` of ``mlbench.optimizers``)."""
