"""`mlbench serve`: the results service that workers on a cluster report to.

One per cluster, in the namespace mlbench runs in, with the run store on a persistent volume:
workers post their metric events to it (:mod:`mlbench.results.http_sink`), the CLI reads runs,
events and files from it through the Kubernetes API server, and its supervisor ends runs whose
pods finished or failed and deletes their pods (:mod:`mlbench.launch.k8s_supervisor`).
"""
