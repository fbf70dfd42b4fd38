"""Where the dashboard's runs live: this machine's run store and, when a cluster is current, the
cluster's (the stores `mlbench status` reads). Every run is reconciled, cancelled and started
through its own launcher (:func:`mlbench.launch.registry.launcher_of`), as the CLI does: a Slurm
run's cancel runs ``scancel``, a ``--record-only`` run's end is read from its folder.

The cluster's store is a mirror that is brought up to date over the network
(:func:`mlbench.launch.kubernetes.open_store`); the dashboard refreshes it at most every
``refresh_s`` seconds and shows what went wrong instead of failing when the cluster cannot be
reached, so this machine's runs stay visible whatever the cluster does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import TypeVar

from mlbench.cloud.config import ClusterRecord
from mlbench.errors import MlbenchError, RunNotFound
from mlbench.launch.base import Launcher
from mlbench.launch.registry import launcher_of
from mlbench.results.store import RunRecord, RunStore

T = TypeVar("T")

LOCAL = "local"
CLUSTER = "cluster"


@dataclass
class Source:
    """One run store and how reading it went."""

    key: str
    label: str
    store: RunStore | None
    error: str | None = None

    def describe(self) -> dict:
        return {"key": self.key, "label": self.label, "error": self.error}

    def open_store(self) -> RunStore:
        """The store of an open source: as :meth:`Sources.by_key` and :meth:`Sources.find` return
        them, and this machine's always."""
        assert self.store is not None, f"the run store {self.key!r} is not open"
        return self.store

    def launcher(self, record: RunRecord) -> Launcher:
        """The launcher of ``record``, one of this store's runs."""
        return launcher_of(self.open_store(), record)


@dataclass
class Page:
    """A page of the runs of all sources (:meth:`Sources.page`)."""

    records: list[tuple[Source, RunRecord]]
    more: bool       # whether runs older than the last of these match too
    total: int       # the runs of all sources
    matching: int    # of those, the ones that hold the words searched for


class Sources:
    """This machine's runs, plus the current cluster's (best effort)."""

    def __init__(self, store: RunStore, cluster: ClusterRecord | None = None,
                 open_cluster: Callable[[ClusterRecord], RunStore] | None = None,
                 refresh_s: float = 10.0):
        self.local = Source(LOCAL, "this machine", store)
        self.cluster_record = cluster
        self.cluster: Source | None = None
        self._open_cluster = open_cluster
        self._refresh_s = refresh_s
        self._opened_at = 0.0
        self._lock = threading.Lock()
        if cluster is not None:
            from mlbench.launch import kubernetes

            self.cluster = Source(CLUSTER, f"cluster {cluster.provider}/{cluster.name}", None)
            self._open_cluster = open_cluster or kubernetes.open_store

    def all(self) -> list[Source]:
        """The sources, the cluster's store refreshed when it is older than ``refresh_s``."""
        if self.cluster is None:
            return [self.local]
        with self._lock:
            if time.monotonic() - self._opened_at >= self._refresh_s:
                self._opened_at = time.monotonic()
                # both set with self.cluster
                assert self._open_cluster is not None and self.cluster_record is not None
                try:
                    self.cluster.store = self._open_cluster(self.cluster_record)
                    self.cluster.error = None
                except MlbenchError as err:
                    self.cluster.error = str(err)
                except Exception as err:  # a cluster's API can fail in many ways; keep serving
                    self.cluster.error = f"cannot read the cluster's runs ({err.__class__.__name__}: {err})"
        return [self.local, self.cluster]

    def by_key(self, key: str) -> Source:
        for source in self.all():
            if source.key == key and source.store is not None:
                return source
        raise MlbenchError(f"no run store {key!r} is open; see the runs page for why")

    def records(self, reconcile_cluster: bool = False) -> list[tuple[Source, RunRecord]]:
        """Every run, oldest first per source; local runs whose supervisor died are marked so
        (as `status` does); cluster runs are brought up to date only when asked."""
        out = []
        for source in self.all():
            def listed(store: RunStore, source: Source = source) -> list[RunRecord]:
                records = store.list()
                if source.key == LOCAL or reconcile_cluster:
                    records = [source.launcher(r).reconcile(r) if r.active else r for r in records]
                return records
            out += [(source, r) for r in self._read(source, listed) or []]
        return out

    @staticmethod
    def _read(source: Source, read: Callable[[RunStore], T]) -> T | None:
        """``read(source.store)``; None for a source without a store, and for a cluster's store
        that cannot be read (its error is noted on the source; this machine's raises)."""
        if source.store is None:
            return None
        try:
            return read(source.store)
        except Exception as err:
            if source.key == LOCAL:
                raise
            source.error = f"cannot read the cluster's runs ({err})"
            return None

    def page(self, limit: int, before: tuple[float, str] | None = None,
             words: tuple[str, ...] = ()) -> Page:
        """Up to ``limit`` runs of all the sources, newest first, created before ``before`` (the
        last run of the previous page, as ``(created_at, id)``), whose id, name, task, optimizer
        or state hold every one of ``words``: each store is asked for its own newest
        (:meth:`RunStore.newest`, one indexed query), and only those runs are reconciled."""
        found, total, matching = [], 0, 0
        for source in self.all():
            def newest(store: RunStore, source: Source = source) -> tuple[list[RunRecord], int, int]:
                records = store.newest(limit + 1, before, words)
                count = store.count()
                hits = store.count(words) if words else count
                if source.key == LOCAL:
                    records = [source.launcher(r).reconcile(r) if r.active else r for r in records]
                return records, count, hits
            read = self._read(source, newest)
            if read is None:
                continue
            records, count, hits = read
            found += [(source, r) for r in records]
            total, matching = total + count, matching + hits
        found.sort(key=lambda pair: (pair[1].created_at, pair[1].id), reverse=True)
        return Page(found[:limit], len(found) > limit, total, matching)

    def find(self, ref: str) -> tuple[Source, RunRecord]:
        """A run by id (or name, or unique prefix) in whichever store holds it, up to date."""
        for source in self.all():
            if source.store is None:
                continue
            try:
                record = source.store.get(ref)
            except RunNotFound:
                continue
            return source, source.launcher(record).reconcile(record)
        raise RunNotFound(f"no run {ref!r}; the runs page lists the runs")
