"""Gossip on real gloo processes: one step is W x, repeated steps reach consensus; topologies."""

from __future__ import annotations

import pytest
import torch

from mlbench.errors import UsageError
from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.optim.descriptors import check_optimizer
from mlbench.optim.decentralized import gossip_
from mlbench.optim.topology import parse_topology
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.optim.support import PLAIN

CASES = {2: ("ring", "complete"), 3: ("ring", "0-1,1-2"), 4: ("ring", "torus", "complete", "0-1,0-2,0-3")}


def start_vector(rank: int) -> torch.Tensor:
    return torch.randn(10, generator=torch.Generator().manual_seed(rank))


def gossip_and_consensus(rank: int, world: int, topologies: tuple[str, ...]) -> dict:
    out = {}
    for text in topologies:
        topology = parse_topology(text, world)
        x = start_vector(rank)
        peers = [(j, topology.weight(rank, j)) for j in topology.neighbours(rank)]
        sent = gossip_(x, topology.weight(rank, rank), peers)
        # Zero gradients: decentralized SGD is pure gossip, from models that differ per rank.
        model = torch.nn.Linear(5, 2)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + rank)))
        initial = [p.detach().clone() for p in model.parameters()]
        ctx = OptimizerContext(model=model, hyper=task_hyper(PLAIN, world), world_size=world, rank=rank,
                               timer=PhaseTimer(torch.device("cpu")), options={"topology": text})
        opt = build_optimizer("decentralized-sgd", ctx)
        restore = opt.state_for_eval()
        evaluated = [p.detach().clone() for p in model.parameters()]
        restore()
        restored = [p.detach().clone() for p in model.parameters()]
        for _ in range(60):
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            opt.step(0.1)
        out[text] = {"gossip": x, "sent": sent, "initial": initial, "evaluated": evaluated, "restored": restored,
                     "final": [p.detach().clone() for p in model.parameters()], "bytes": opt.bytes_sent}
    return out


@pytest.mark.parametrize("world", sorted(CASES))
def test_one_gossip_step_is_w_x_and_zero_gradients_reach_consensus_of_the_average(on_ranks, world):
    results = on_ranks(gossip_and_consensus, world, CASES[world])
    x = torch.stack([start_vector(r) for r in range(world)]).double()
    for text in CASES[world]:
        topology = parse_topology(text, world)
        w = topology.mixing_matrix()
        expected = w @ x
        for rank in range(world):
            res = results[rank][text]
            torch.testing.assert_close(res["gossip"].double(), expected[rank], atol=1e-6, rtol=1e-6)
            assert res["sent"] == 4 * 10 * topology.degree(rank)
            assert res["bytes"] == 60 * 4 * 12 * topology.degree(rank)
        for i in range(2):   # the weight and the bias of the linear model
            mean = torch.stack([results[r][text]["initial"][i] for r in range(world)]).mean(0)
            for rank in range(world):
                res = results[rank][text]
                torch.testing.assert_close(res["final"][i], mean, atol=1e-5, rtol=1e-5)
                # Evaluation sees the average model; training gets the rank's own model back.
                torch.testing.assert_close(res["evaluated"][i], mean, atol=1e-6, rtol=1e-6)
                assert torch.equal(res["restored"][i], res["initial"][i])


@pytest.mark.parametrize("text,world", [("ring", 5), ("torus", 6), ("torus:2x3", 6), ("complete", 4),
                                        ("0-1,1-2,2-3,3-0", 4)])
def test_mixing_matrices_are_symmetric_and_doubly_stochastic(text, world):
    w = parse_topology(text, world).mixing_matrix()
    torch.testing.assert_close(w, w.t())
    torch.testing.assert_close(w.sum(1), torch.ones(world, dtype=torch.float64))
    assert (w >= 0).all()


def test_topology_neighbours():
    assert parse_topology("ring", 5).neighbours(0) == [1, 4]
    assert parse_topology("ring", 2).neighbours(0) == [1]
    assert parse_topology("torus", 9).neighbours(4) == [1, 3, 5, 7]
    assert parse_topology("torus:2x4", 8).neighbours(0) == [1, 3, 4]
    assert parse_topology("complete", 4).weight(0, 3) == pytest.approx(0.25)
    assert parse_topology("ring", 1).neighbours(0) == []


@pytest.mark.parametrize("text,world,message", [
    ("torus", 5, "factors as R x C"),
    ("torus:2x3", 8, "has 6 nodes"),
    ("0-1,2-3", 4, "does not connect"),
    ("0-4", 4, "outside 0..3"),
    ("1-1", 2, "two different ranks"),
    ("star", 4, "expected ring, torus"),
])
def test_topologies_that_do_not_fit_are_usage_errors(text, world, message):
    with pytest.raises(UsageError, match=message):
        check_optimizer("decentralized-sgd", {"topology": text}, world)
