"""Many learners on one machine: a rollout per rank, the actor in DDP.

Run it with two ranks on the CPU (gloo)::

    torchrun --standalone --nproc_per_node 2 examples/ddp_cartpole.py [N_BATCHES]

Each rank makes its own ``single.rollout`` over CartPole with the same
``entropy``: the rank draws from a seeding tree of its own (rank 0 from
the run's), so the ranks collect different episodes. ``cpu_affinity=
"auto"`` pins each rank's worker on that rank's share of the cores. The
actor's network is wrapped in ``DistributedDataParallel``: each rank
computes an actor-critic loss with V-trace targets (``single`` collects
with the parameters one version behind) on its own batch, DDP averages
the gradients, and every rank takes the same optimiser step. Each rank
prints one line of JSON, in rank order: what it collected and where, its own
statistics and the total of steps over the ranks.
"""
import contextlib
import functools
import hashlib
import itertools
import json
import os
import sys

import gymnasium
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlplay.engine import PolicyActor, acted, vtrace
from rlplay.engine.rollout import single

N_STEPS, N_ENVS, ENTROPY = 32, 4, 42


class Net(nn.Module):
    """CartPole: the logits of the 2 actions, and a value."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 64), nn.Tanh())
        self.pi, self.v = nn.Linear(64, 2), nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def digest(tensor):
    """A short hash of a tensor's bytes (to compare ranks' data)."""
    return hashlib.sha256(tensor.numpy().tobytes()).hexdigest()[:16]


def loss_of(model, net, batch):
    """The actor-critic loss of one batch, V-trace corrected."""
    logits, value = model(batch.state.obs)  # through DDP: rows 0..T
    dist_t = torch.distributions.Categorical(logits=logits[:-1])
    target_logp = dist_t.log_prob(batch.state.act[1:])
    with torch.no_grad():  # the true last observations, no gradient
        value_final = net(batch.final)[1]
    out = vtrace(batch.state.rew, batch.state.fin, batch.truncated,
                 value.detach(), value_final, target_logp=target_logp,
                 behaviour_logp=batch.actor["logp"], gamma=0.99,
                 mask=~acted(batch))
    live = acted(batch)[1:]
    policy = -(out.advantages * target_logp)[live].mean()
    critic = (out.vs - value[:-1])[live].pow(2).mean()
    entropy = dist_t.entropy()[live].mean()
    return policy + 0.5 * critic - 0.01 * entropy


def main(n_batches):
    dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, ...
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # DDP starts every rank from rank 0's anyway
    net = Net()
    model = DistributedDataParallel(net)  # before the rollout copies net
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    factory = functools.partial(gymnasium.make, "CartPole-v1")
    feed = single.rollout(factory, PolicyActor(net), N_STEPS, N_ENVS,
                          entropy=ENTROPY, cpu_affinity="auto")
    returns = []  # of the episodes that ended, in order
    with contextlib.closing(feed):
        for i, batch in enumerate(itertools.islice(feed, n_batches)):
            if i == 0:
                first = digest(batch.state.obs)
            returns.extend(float(r) for r in feed.stats["returns"])
            loss = loss_of(model, net, batch)
            optim.zero_grad()
            loss.backward()  # DDP averages the gradients of the ranks
            optim.step()
        cores = sorted(os.sched_getaffinity(feed.pid))
        state = feed.state_dict()  # this rank's: save it per rank
        steps = feed.stats["steps"]
    total = torch.tensor([steps])
    dist.all_reduce(total)  # each rank's stats are its own: sum them
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    line = json.dumps({
        "rank": rank, "world_size": world_size,
        "state_rank": state["rank"], "seeds": state["seeds"],
        "first_obs": first, "worker_cores": cores,
        "first_returns": returns[:4], "episodes": len(returns),
        "last_returns_mean": round(sum(returns[-20:]) / 20, 1),
        "steps": steps, "total_steps": int(total.item()),
        "params": digest(params)})
    # the ranks share one terminal: each prints its line in its turn
    for turn in range(world_size):
        if turn == rank:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
