"""Kubernetes clusters for benchmarks: create, adopt, list, choose and delete them.

- :mod:`~mlbench.cloud.config`: the clusters mlbench knows (``ClusterRecord``), the current one
  (``current_cluster()``; None means this machine), mlbench's own kubeconfig, and
  ``kube_api_client(record)`` for code that talks to a cluster (e.g. the Kubernetes launcher).
- :mod:`~mlbench.cloud.provisioner`: the interface every provider implements (credentials,
  create, wait, kube access, query, delete, hourly cost), after SkyPilot's provisioners.
- :mod:`~mlbench.cloud.gcloud` (GKE), :mod:`~mlbench.cloud.aws` (EKS),
  :mod:`~mlbench.cloud.kind` (KIND): the providers; :mod:`~mlbench.cloud.existing` adopts a
  cluster from a kube context.
- :mod:`~mlbench.cloud.manager`: the life cycles behind the CLI commands.
- :mod:`~mlbench.cloud.image`: the worker image; :mod:`~mlbench.cloud.token`: GKE/EKS tokens.
"""
