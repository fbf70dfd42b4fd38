"""The runs of a cluster on this machine: a local mirror of the results service's run store.

`status`, `download` (and anything else that reads a run store) work on a cluster's runs exactly
as on local ones because :class:`ClusterStore` *is* a run store, kept in step with the service:
the catalog is copied on open, and a run's folder (run.json, events, logs) is copied whenever the
run is looked at: the files that only grow (events, logs) incrementally, whole lines only; run.json,
which the service rewrites (its supervisor records a run's injected faults there), and the summary
of a run's checkpoints (checkpoints.json), whole, replacing the copy when it changed. Creating and deleting go to the
service first. A run that ended and was copied completely is marked so and never fetched again,
which is also why its results stay readable here after its pods, or even the cluster, are gone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mlbench.errors import ClusterError, RunNotFound
from mlbench.launch.k8s_client import ResultsClient
from mlbench.results.checkpoints import SUMMARY_FILE
from mlbench.results.store import ACTIVE_STATES, RUN_FOLDER_FILES, SETTLED_FILE, RunRecord, RunStore
from mlbench.safefile import open_append, write_bytes

COMPLETE_MARK = ".mirrored"
_RUN_ID = re.compile(r"^[0-9a-f]{4,32}$")
#: the files the service rewrites rather than appends to: copied whole (SUMMARY_FILE: the summary
#: of the run's checkpoints on the service's volume)
_REWRITTEN = ("run.json", SUMMARY_FILE)


class ClusterStore(RunStore):
    """A run store mirroring one cluster's results service (``client`` None: not deployed yet)."""

    def __init__(self, home: str | Path, where: str, client: ResultsClient | None = None,
                 api: Any = None, namespace: str = "", context: str = ""):
        super().__init__(home)
        self.where = where
        self.client = client
        self.api = api
        self.namespace = namespace
        self.context = context

    def service(self) -> ResultsClient:
        if self.client is None:
            raise ClusterError(f"No results service runs on {self.where} yet; `mlbench run` "
                               "starts it with the first run.")
        return self.client

    def _put(self, record: dict[str, Any]) -> None:
        if not _RUN_ID.match(str(record.get("id", ""))):
            raise ClusterError(f"The results service of {self.where} sent a bad run id "
                               f"{record.get('id')!r}; check what MLBENCH_RESULTS_URL points to.")
        self.put(record)

    # -- writing goes to the service first ------------------------------------------------
    def create(self, **fields: Any) -> RunRecord:
        """A new pending run, recorded by the service (same arguments as RunStore.create).

        ``files`` (a plug-in's source) stay in this machine's copy of the run folder, from which
        the launcher ships them to the pods in the run's ConfigMap; the service's run.json
        records their SHA-256."""
        files: dict[str, bytes] = fields.pop("files", None) or {}
        record = self.service().call("POST", "/v1/runs", fields)
        self._put(record)
        run_dir = self.runs_dir / record["id"]
        for relative, data in files.items():
            path = run_dir / relative
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.write_bytes(data)
        return self.sync_run(record["id"])

    def delete(self, run_id: str) -> None:
        if self.client is not None:
            try:
                self.client.call("DELETE", f"/v1/runs/{run_id}")
            except RunNotFound:
                pass
        super().delete(run_id)

    # -- keeping the mirror in step -------------------------------------------------------
    def sync_catalog(self) -> None:
        """Copy the service's catalog; forget runs it no longer has."""
        if self.client is None:
            return
        remote = self.client.call("GET", "/v1/runs")["runs"]
        for record in remote:
            self._put(record)
        known = {r["id"] for r in remote}
        for record in super().list():
            if record.id not in known:
                super().delete(record.id)

    def resume(self, run_id: str, max_steps: int | None) -> RunRecord:
        """`mlbench resume` of an ended run: the service makes it pending again from its newest
        checkpoint (``/resume``), and this copy, marked whole when the run ended, is brought up
        to date (run.json now names the checkpoint and the resume)."""
        self.service().call("POST", f"/v1/runs/{run_id}/resume", {"max_steps": max_steps})
        (self.runs_dir / run_id / COMPLETE_MARK).unlink(missing_ok=True)
        return self.sync_run(run_id)

    def sync_run(self, run_id: str) -> RunRecord:
        """Bring one run's record and folder up to date; return the record."""
        if self.client is None or (self.runs_dir / run_id / COMPLETE_MARK).exists():
            return self.get(run_id)
        try:
            record = self.client.call("GET", f"/v1/runs/{run_id}")
        except RunNotFound:
            super().delete(run_id)
            raise
        self._put(record)
        files = self.client.call("GET", f"/v1/runs/{run_id}/files")["files"]
        # whole once the run ended and its pods are gone (the supervisor's mark): until then its
        # workers may still write their last checkpoint and log lines
        complete = record["state"] not in ACTIVE_STATES and SETTLED_FILE in files
        for relative, size in files.items():
            if relative in _REWRITTEN:
                complete &= self._replace(run_id, relative, int(size))
            elif RUN_FOLDER_FILES.match(relative):
                complete &= self._copy(run_id, relative, int(size))
        if complete:
            (self.runs_dir / run_id / COMPLETE_MARK).touch()
        return self.get(run_id)

    def _replace(self, run_id: str, relative: str, size: int) -> bool:
        """Copy a JSON file the service rewrites whole, replacing the local copy (atomically)
        when it differs; True when the copy is whole. Appending what the copy lacks would splice
        two versions; a version read while the service replaced it (not one JSON document) is
        left for the next look."""
        data = b""
        while len(data) < size:
            chunk = self._read(run_id, relative, len(data))
            if not chunk:
                break
            data += chunk
        try:
            json.loads(data)
        except ValueError:
            return False
        local = self.runs_dir / run_id / relative
        if not local.exists() or local.read_bytes() != data:
            local.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_bytes(local, data, mode=0o600)
        return len(data) == size

    def _read(self, run_id: str, relative: str, offset: int) -> bytes:
        """The bytes of a listed file from ``offset``; none when it is gone since the listing (the
        copy is then not whole, and the next look lists the folder again)."""
        try:
            return self.service().raw(f"/v1/runs/{run_id}/file?path={quote(relative)}&offset={offset}")
        except RunNotFound:
            return b""

    def _copy(self, run_id: str, relative: str, size: int) -> bool:
        """Append what the local copy lacks, whole lines only; True when it is whole."""
        local = self.runs_dir / run_id / relative
        local.parent.mkdir(parents=True, exist_ok=True)
        have = local.stat().st_size if local.exists() else 0
        while have < size:
            chunk = self._read(run_id, relative, have)
            whole = chunk[:chunk.rfind(b"\n") + 1]
            if not whole:
                break
            with open_append(local) as f:  # mode 600, as the rest of the store
                f.write(whole)
            have += len(whole)
        return have >= size
