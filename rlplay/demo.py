"""Train an actor-critic on CartPole-v1 with PPO, then evaluate it.

Run it with ``make demo`` or ``python -m rlplay.demo --help``.

Collection runs in a worker process (``single.rollout``) while the learner
trains on the previous fragment, so every batch was collected with the
parameters of one update ago. PPO suits this: its clipped probability ratio
is taken against the log-probabilities recorded by the actor that collected
the batch (``batch.actor["logp"]``), so the policy it corrects for is the
one that acted. The values are recomputed with the current critic (those of
the final observations too), and :func:`rlplay.engine.gae` bootstraps
through CartPole's time limit of 500 steps, not through its terminations.
The hyper-parameters are the usual ones of PPO on CartPole, with a larger
learning rate (annealed linearly to zero) to learn within seconds.

A subprocess evaluator plays greedy episodes with the parameters of every
tenth batch while training goes on. Training stops after two perfect
evaluations in a row (or at the step or time budget), and the best
evaluated parameters play fresh episodes for the final evaluation. The
progress bar counts env steps against the step budget; a run that stops
earlier ends its bar there, at 100%, saying why it stopped. Given
``--seed`` the run is reproducible, unless the time budget cuts it short.

Given ``--logdir DIR`` (the ``tensorboard`` extra: ``pip install -e
'path/to/rlplay[tensorboard]'``), the training
curves go to TensorBoard event files in ``DIR`` (``tensorboard --logdir
DIR`` shows them), all at the env steps trained on so far:

- ``rollout/...``: the generator's ``stats`` after every batch, through
  :func:`rlplay.engine.log_stats` (the mean of ``returns`` and ``lengths``
  of the episodes that ended in the batch, throughput, waits);
- ``train/...``: after every batch, the learning rate, the means of PPO's
  losses (``loss_pi``, ``loss_v``) and of the policy's ``entropy`` over its
  minibatches, and the mean ``return`` of the last 20 training episodes
  (once one has ended);
- ``eval/return`` and ``eval/best``: every evaluation during training, at
  the step of the parameters it evaluated; ``eval/final_return``: the
  final evaluation, at the last step.
"""
import argparse
import contextlib
import copy
import functools
import time
from collections import deque
from contextlib import closing

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from rlplay.engine import PolicyActor, episode_stats, gae, log_stats
from rlplay.engine.rollout import Evaluator, same, single

N_ENVS, N_STEPS = 8, 128           # a batch of 8 x 128 = 1024 steps
GAMMA, LAMBDA = 0.99, 0.95         # discount and GAE's lambda
N_EPOCHS, N_MINIBATCHES = 4, 4     # PPO passes over each batch
CLIP, ENT_COEF, VF_COEF = 0.2, 0.01, 0.5
LR, MAX_GRAD_NORM = 1e-3, 0.5      # the learning rate anneals linearly to 0
EVAL_EVERY, EVAL_LAG = 10, 3       # ask every 10 batches, read 3 batches on
N_EVAL_EPISODES = 20
MAX_RETURN = 500.0                 # CartPole-v1 truncates at 500 steps
N_PERFECT = 2                      # stop after this many perfect evaluations


def layer(n_in, n_out, std=2 ** 0.5):
    # orthogonal initialisation, as in most PPO implementations
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.zeros_(linear.bias)
    return linear


class ActorCritic(nn.Module):
    """Separate policy and value MLPs; returns ``(logits, value)``."""

    def __init__(self, n_obs=4, n_actions=2, n_hidden=64):
        super().__init__()
        self.pi = nn.Sequential(
            layer(n_obs, n_hidden), nn.Tanh(),
            layer(n_hidden, n_hidden), nn.Tanh(),
            layer(n_hidden, n_actions, std=0.01))
        self.v = nn.Sequential(
            layer(n_obs, n_hidden), nn.Tanh(),
            layer(n_hidden, n_hidden), nn.Tanh(),
            layer(n_hidden, 1, std=1.0))

    def forward(self, obs):
        return self.pi(obs), self.v(obs)


def ppo_update(actor, optim, batch):
    """A few epochs of clipped PPO on one fragment ``(1 + T, B)``; returns
    the means over its minibatches of the policy's and the value's losses
    and of the policy's entropy."""
    state, critic = batch.state, actor.policy.v
    with torch.no_grad():
        value = critic(state.obs).squeeze(-1)               # (1 + T, B)
        value_final = critic(batch.final).squeeze(-1)       # (1 + T, B)
        adv = gae(state.rew, state.fin, batch.truncated, value, value_final,
                  gamma=GAMMA, lam=LAMBDA)                  # (T, B)
        ret = adv + value[:-1]

    # row t: the observation acted on, the action taken there (recorded in
    # row t + 1) and its log-probability under the collecting actor
    obs = state.obs[:-1].flatten(0, 1)
    act = state.act[1:].flatten(0, 1)
    logp_old = batch.actor["logp"][:-1].flatten(0, 1)
    adv, ret = adv.flatten(), ret.flatten()

    size = len(obs) // N_MINIBATCHES
    sums, n_updates = dict.fromkeys(("loss_pi", "loss_v", "entropy"), 0.0), 0
    for _ in range(N_EPOCHS):
        for idx in torch.randperm(len(obs)).split(size):
            dist, value = actor(obs[idx])
            ratio = torch.exp(dist.log_prob(act[idx]) - logp_old[idx])
            a = adv[idx]
            a = (a - a.mean()) / (a.std() + 1e-8)
            loss_pi = -torch.min(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP)
                                 * a).mean()
            loss_v = F.mse_loss(value, ret[idx])
            entropy = dist.entropy().mean()
            loss = loss_pi + VF_COEF * loss_v - ENT_COEF * entropy
            optim.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(actor.parameters(), MAX_GRAD_NORM)
            optim.step()
            for key, term in zip(sums, (loss_pi, loss_v, entropy)):
                sums[key] += term.item()
            n_updates += 1
    return {key: total / n_updates for key, total in sums.items()}


class _NoCurves:
    """The writer without ``--logdir``: its curves go nowhere."""

    def add_scalar(self, tag, value, global_step=None):
        pass


def writer_opener(logdir, parser):
    """What opens the writer of the curves, given ``logdir``: TensorBoard's
    ``SummaryWriter`` (a context manager that closes it) or, without a
    ``logdir``, a null context that gives a writer of nothing. A missing
    TensorBoard is refused here, before anything starts."""
    if logdir is None:
        return lambda logdir: contextlib.nullcontext(_NoCurves())
    try:  # imported only when asked for: TensorBoard is an extra
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        parser.error(f"--logdir needs TensorBoard ({exc}): "
                     f"pip install -e 'path/to/rlplay[tensorboard]' "
                     f"(rlplay's clone with its tensorboard extra), or "
                     f"pip install 'tensorboard>=2'")
    return SummaryWriter


def parse_args(argv):
    """The demo's arguments, and what opens the writer of its curves."""
    parser = argparse.ArgumentParser(prog="python -m rlplay.demo",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--generator", choices=["single", "same"],
                        default="single", help="double-buffered in a worker "
                        "process, or in this process between batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=500_000,
                        help="env steps (the learning rate anneals to 0)")
    parser.add_argument("--budget-seconds", type=float, default=110.0,
                        help="stop training after this long")
    parser.add_argument("--logdir", default=None,
                        help="write the training curves to TensorBoard "
                        "event files in this directory (needs "
                        "rlplay[tensorboard])")
    args = parser.parse_args(argv)
    return args, writer_opener(args.logdir, parser)


def main(argv=None):
    args, open_writer = parse_args(argv)

    torch.set_num_threads(1)   # a tiny MLP: threads only add overhead
    torch.manual_seed(args.seed)
    factory = functools.partial(gymnasium.make, "CartPole-v1")
    actor = PolicyActor(ActorCritic())
    optim = torch.optim.Adam(actor.parameters(), lr=LR, eps=1e-5)

    # one entropy seeds everything: the evaluator's envs get seeds apart
    # from the rollout's
    evaluator = Evaluator(factory, actor, n_envs=N_EVAL_EPISODES,
                          n_episodes=N_EVAL_EPISODES, entropy=args.seed)
    rollout = {"single": single, "same": same}[args.generator].rollout
    feed = rollout(factory, actor, N_STEPS, N_ENVS, entropy=args.seed)

    recent = deque(maxlen=20)      # returns of the last training episodes
    pending = None                 # (batch, parameters, steps) evaluated
    best, best_params = 0.0, None  # any evaluation beats 0 on CartPole
    n_perfect, n_steps, started = 0, 0, time.monotonic()
    desc = f"PPO, {args.generator}.rollout"
    bar = tqdm(total=args.steps, unit="step", unit_scale=True, desc=desc)
    with closing(feed), closing(evaluator), \
            open_writer(args.logdir) as writer:
        for k, batch in enumerate(feed):
            lr = LR * (1.0 - n_steps / args.steps)
            for group in optim.param_groups:   # anneal linearly to 0
                group["lr"] = lr
            losses = ppo_update(actor, optim, batch)

            n_steps += batch.state.rew[1:].numel()
            recent.extend(episode_stats(batch)[0])
            bar.update(batch.state.rew[1:].numel())
            mean_return = np.mean(recent) if recent else 0.0
            log_stats(writer, feed.stats, n_steps, prefix="rollout/")
            train = {"lr": lr, **losses}
            if recent:
                train["return"] = mean_return
            log_stats(writer, train, n_steps, prefix="train/")
            bar.set_postfix({"return": f"{mean_return:.1f}",
                             "best eval": f"{best:.1f}"})

            # ask for an evaluation, carry on training, pick the answer up
            # a few batches later (always the same batch: reproducible)
            stop = n_steps >= args.steps \
                or time.monotonic() - started > args.budget_seconds
            if pending is not None and (k == pending[0] + EVAL_LAG or stop):
                score = float(np.mean(evaluator.result().returns))
                if score >= best:
                    best, best_params = score, pending[1]
                n_perfect = n_perfect + 1 if score >= MAX_RETURN else 0
                log_stats(writer, {"return": score, "best": best},
                          pending[2], prefix="eval/")
                pending = None
            if n_perfect >= N_PERFECT:
                outcome = "solved"
                why = (f"{N_PERFECT} evaluations in a row returned "
                       f"{MAX_RETURN:g}")
                break
            if stop:
                outcome = "stopped"
                why = (f"the step budget ({args.steps}) is spent"
                       if n_steps >= args.steps else f"the time budget "
                       f"({args.budget_seconds:g} s) is spent")
                break
            if pending is None and (k + 1) % EVAL_EVERY == 0:
                evaluator.submit(actor)
                pending = (k, copy.deepcopy(actor.state_dict()), n_steps)
        # the bar ends where the run did, full: stopping early is no abort
        bar.total = bar.n
        bar.set_description(f"{desc}: {outcome}")
        bar.close()
        elapsed = time.monotonic() - started

        # the best evaluated parameters, on fresh episodes
        if best_params is not None:
            actor.load_state_dict(best_params)
        evaluator.submit(actor)
        returns = evaluator.result().returns
        log_stats(writer, {"final_return": float(np.mean(returns))},
                  n_steps, prefix="eval/")

    during = (f"best evaluation {best:.1f}" if best_params is not None
              else "no evaluation finished during training")
    print(f"{outcome} at {n_steps} env steps: {why}")
    print(f"trained on {n_steps} env steps in {elapsed:.1f}s with "
          f"{args.generator}.rollout; {during}")
    print(f"evaluation return: {np.mean(returns):.1f} +- "
          f"{np.std(returns):.1f} over {len(returns)} greedy episodes")
    return float(np.mean(returns))


if __name__ == "__main__":
    main()
