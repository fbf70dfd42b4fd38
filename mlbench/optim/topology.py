"""Communication graphs for gossip, and their mixing matrices.

A topology is an undirected, connected graph on the ranks 0..k-1 (rank 0 is a node like any
other). Gossip averaging replaces each rank's vector x_i by sum_j W_ij x_j, with W the
Metropolis-Hastings weights of the graph (Xiao & Boyd 2004, "Fast linear iterations for
distributed averaging"; Boyd et al. 2006, "Randomized gossip algorithms"):

    W_ij = 1 / (1 + max(deg i, deg j))  for each edge,   W_ii = 1 - sum_j W_ij.

W is symmetric and doubly stochastic, so gossip keeps the average of the x_i, and on a
connected graph repeated gossip converges to it (consensus). Each rank needs only its own
degree and its neighbours' degrees, which every rank derives from the same description.

Descriptions (``--opt topology=...``): ``ring``; ``torus`` (an R x C grid with wrap-around, R x C
the most nearly square factorisation of k with R, C >= 2) or ``torus:RxC``; ``complete`` (exact
averaging, the centralized limit); or an explicit edge list ``0-1,1-2,2-3,3-0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlbench.errors import UsageError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Topology:
    """An undirected graph on ``world`` ranks: ``edges`` holds (i, j) with i < j."""

    world: int
    edges: frozenset[tuple[int, int]]
    description: str

    def neighbours(self, rank: int) -> list[int]:
        return sorted({j for i, j in self.edges if i == rank} | {i for i, j in self.edges if j == rank})

    def degree(self, rank: int) -> int:
        return len(self.neighbours(rank))

    def weight(self, i: int, j: int) -> float:
        """W_ij of the Metropolis-Hastings mixing matrix."""
        if i == j:
            return 1.0 - sum(self.weight(i, n) for n in self.neighbours(i))
        if (min(i, j), max(i, j)) not in self.edges:
            return 0.0
        return 1.0 / (1 + max(self.degree(i), self.degree(j)))

    def mixing_matrix(self) -> torch.Tensor:
        """W as a float64 k x k matrix."""
        import torch  # here only: the CLI checks topologies without torch

        return torch.tensor([[self.weight(i, j) for j in range(self.world)] for i in range(self.world)],
                            dtype=torch.float64)


def _edge(i: int, j: int) -> tuple[int, int]:
    return (min(i, j), max(i, j))


def ring(world: int) -> frozenset[tuple[int, int]]:
    return frozenset(_edge(i, (i + 1) % world) for i in range(world) if (i + 1) % world != i)


def torus(rows: int, cols: int) -> frozenset[tuple[int, int]]:
    """Each rank r = row*cols + col is joined to its right and lower neighbours (wrapping)."""
    edges = set()
    for r in range(rows):
        for c in range(cols):
            me = r * cols + c
            for other in (r * cols + (c + 1) % cols, ((r + 1) % rows) * cols + c):
                if other != me:
                    edges.add(_edge(me, other))
    return frozenset(edges)


def complete(world: int) -> frozenset[tuple[int, int]]:
    return frozenset((i, j) for i in range(world) for j in range(i + 1, world))


def _square_factors(world: int) -> tuple[int, int] | None:
    for rows in range(math.isqrt(world), 1, -1):
        if world % rows == 0 and world // rows >= 2:
            return rows, world // rows
    return None


def _parse_torus(text: str, world: int) -> frozenset[tuple[int, int]]:
    if text == "torus":
        dims = _square_factors(world)
        if dims is None:
            raise UsageError(f"topology torus needs a worker count that factors as R x C with R, C >= 2, "
                             f"not {world}; use topology=ring")
        return torus(*dims)
    shape = text.split(":", 1)[1].lower().split("x")
    try:
        rows, cols = (int(v) for v in shape)
    except ValueError:
        raise UsageError(f"topology {text}: expected torus:RxC, e.g. torus:2x4") from None
    if rows < 1 or cols < 1 or rows * cols != world:
        raise UsageError(f"topology {text} has {rows * cols} nodes, but the run has {world} workers")
    return torus(rows, cols)


def _parse_edges(text: str, world: int) -> frozenset[tuple[int, int]]:
    edges = set()
    for item in text.split(","):
        a, sep, b = item.strip().partition("-")
        try:
            i, j = int(a), int(b)
        except ValueError:
            raise UsageError(f"topology {text}: expected ring, torus, torus:RxC, complete or an edge "
                             "list such as 0-1,1-2,2-0") from None
        if not sep or i == j:
            raise UsageError(f"topology edge {item.strip()!r}: expected two different ranks, e.g. 0-1")
        if not (0 <= i < world and 0 <= j < world):
            raise UsageError(f"topology edge {item.strip()} names a rank outside 0..{world - 1} "
                             f"({world} workers)")
        edges.add(_edge(i, j))
    return frozenset(edges)


def _connected(world: int, edges: frozenset[tuple[int, int]]) -> bool:
    seen, frontier = {0}, [0]
    while frontier:
        node = frontier.pop()
        for i, j in edges:
            for a, b in ((i, j), (j, i)):
                if a == node and b not in seen:
                    seen.add(b)
                    frontier.append(b)
    return len(seen) == world


def parse_topology(text: str, world: int) -> Topology:
    """The topology a description names for ``world`` ranks, or a UsageError."""
    text = text.strip().lower()
    if world < 1:
        raise UsageError(f"a topology needs at least one worker, not {world}")
    if text == "ring":
        edges = ring(world)
    elif text == "complete":
        edges = complete(world)
    elif text == "torus" or text.startswith("torus:"):
        edges = _parse_torus(text, world)
    else:
        edges = _parse_edges(text, world)
    if not _connected(world, edges):
        raise UsageError(f"topology {text} does not connect all {world} workers, so they could never "
                         "agree on a model; add edges")
    return Topology(world, edges, text)
