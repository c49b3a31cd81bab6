"""Torch-native envs: ``same.rollout`` over ``rlplay.envs.TorchCartPole``
(the torch fragment loop) beside a hand-written torch loop over the same
env and Gymnasium's numpy ``CartPoleVectorEnv`` of the same size.

Rows, for each size ``n`` of ``--sizes`` (1,024 and 8,192 by default),
every one stepping ``n`` CartPoles with the benchmarks' actor (a
4-64-64-2 MLP sampling from a categorical, one torch thread, under
``torch.no_grad()``) in fragments of ``--steps`` rows:

``torch.n/hand``
    The hand-written torch loop: one actor call and one ``step`` per row,
    the observations, actions, rewards and ends written into preallocated
    ``(1 + T, n)`` tensors (no final observations, no episode accounting,
    no checks). The reference (``x hand``).
``torch.n/same.rollout``
    ``same.rollout(TorchCartPole, ..., copy=False)``: the full layout
    (``final``, ``truncated``, ``acted``, ``stepno``, episode statistics,
    the lookahead row), ``check_spaces`` on its first fragment only.
``torch.n/same.rollout.alternating``
    The two loops above timed fragment by fragment in turn within one
    window (``harness.alternated``): its ``x hand`` is the ratio of the
    two sums of that window, the drift of a loaded machine left out; and
    the ratio of the two loops' CPU time (this thread's) in that window,
    which leaves out the time a call waited for a core.
``numpy.n/hand``, ``numpy.n/same.rollout``
    Gymnasium's ``CartPoleVectorEnv`` (numpy, next-step autoreset) driven
    by the same actor into preallocated arrays, and ``same.rollout`` over
    it (the numpy fragment loop, lost calls marked).
``jax.n/hand``, ``jax.n/same.rollout``, ``jax.n/same.rollout.alternating``
    gymnax's CartPole (JAX, on JAX's default device): by hand, one
    jit-compiled call a row (a key split, gymnax's own auto-resetting
    ``step`` under ``jax.vmap``), the actions to JAX and the outputs to
    torch through DLPack, written into preallocated ``(1 + T, n)``
    tensors; ``same.rollout`` over ``rlplay.envs.JaxSource(Gymnax(...))``
    (the torch fragment loop: true last observations, time limits as
    truncations, statistics); and the two alternating, as for torch.
    Skipped, saying so, where JAX or gymnax is missing (``pip install -e
    'path/to/rlplay[jax]'``).

``brax.NAME.n/hand``, ``brax.NAME.n/same.rollout``, ``....alternating``
    Only with ``--brax NAME`` (``halfcheetah``; Brax's steps take tens of
    seconds to compile on a CPU, once per size): Brax's env ``NAME`` on
    the pipeline of ``--brax-backend`` (``mjx``, MuJoCo's MJX, by
    default), stepped with a Gaussian MLP (64-64 hidden units) on the
    torch rows' device, its samples clipped to [-1, 1]. By hand: Brax's
    own training wrappers (``VmapWrapper``, ``EpisodeWrapper`` at 1,000
    steps, ``AutoResetWrapper``, which overwrites the last
    observations), one jit-compiled step a row, DLPack both ways,
    preallocated tensors;
    ``same.rollout`` over ``JaxSource(Brax(...))`` (the last
    observations kept, time limits as truncations, statistics); the two
    alternating. Skipped, saying so, where Brax is missing.

Every row runs once per round, rows in turn (``harness.measure``);
steps/s are medians over ``--rounds`` rounds with their spread
``[min-max]``, ratios taken round by round. With ``--device cuda`` (where
CUDA is present) the torch rows run there with the actor there too (each
fragment ends with a ``torch.cuda.synchronize()``); without CUDA the
script says so in one line and measures the CPU rows.

    python benchmarks/torch_envs.py [--json] [--rounds 3] [--duration 1]
                                    [--sizes 1024,8192] [--steps 64]
                                    [--device cpu] [--brax halfcheetah]
                                    [--brax-backend mjx]
"""
import argparse
import functools
import sys
import time

import gymnasium
import numpy as np
import torch

from harness import (Row, alternated, fmt, measure, paired, print_json,
                     record, spread, stats, timed)
from rlplay.engine.rollout import same
from rlplay.envs import TorchCartPole
from workloads import GaussianActor, MLPActor

__all__ = ["main"]


def _sync(device):
    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    return lambda: None


def _actor(device):
    """The actor of every row: the same weights (the speed of ``tanh``
    depends on its inputs)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MLPActor().to(device)


def _rows(n_envs, n_steps, device):
    """The hand loops' preallocated rows of a CartPole fragment on
    ``device``: observations, actions, rewards and ends, ``(1 + T, n)``."""
    rows = (n_steps + 1, n_envs)
    return (torch.zeros(rows + (4,), device=device),
            torch.zeros(rows, dtype=torch.int64, device=device),
            torch.zeros(rows, device=device),
            torch.zeros(rows, dtype=torch.bool, device=device))


def hand_torch(n_envs, n_steps, device):
    """The hand-written torch loop over ``TorchCartPole(n_envs)``:
    ``(fragment, close)``."""
    env = TorchCartPole(n_envs, device=device)
    actor = _actor(device)
    obs, act, rew, done = _rows(n_envs, n_steps, device)
    obs[0], _ = env.reset(seed=0)
    sync = _sync(device)

    def fragment():
        for t in range(n_steps):
            # (1, n, 4), the input rlplay gives the actor: the ratio is of
            # the loops (an MLP may take another kernel on (n, 4))
            act[t + 1] = actor.sample(obs[t:t + 1])[0]
            x, r, terminated, truncated, _ = env.step(act[t + 1])
            obs[t + 1] = x
            rew[t + 1] = r
            torch.logical_or(terminated, truncated, out=done[t + 1])
        obs[0] = obs[n_steps]
        sync()
    return fragment, env.close


def rollout_torch(n_envs, n_steps, device):
    """``same.rollout`` over ``TorchCartPole(n_envs)``: ``(fragment,
    close)``."""
    factory = functools.partial(TorchCartPole, n_envs, device=device)
    feed = same.rollout(factory, _actor(device), n_steps, n_envs,
                        entropy=0, copy=False)
    sync = _sync(device)

    def fragment():
        next(feed)
        sync()
    return fragment, feed.close


def hand_numpy(n_envs, n_steps):
    """Gymnasium's ``CartPoleVectorEnv`` driven by hand into arrays."""
    env = gymnasium.make_vec("CartPole-v1", n_envs,
                             vectorization_mode="vector_entry_point")
    actor = _actor(torch.device("cpu"))
    obs = np.zeros((n_steps + 1, n_envs, 4), np.float32)
    act = np.zeros((n_steps + 1, n_envs), np.int64)
    rew = np.zeros((n_steps + 1, n_envs), np.float32)
    done = np.zeros((n_steps + 1, n_envs), bool)
    obs[0], _ = env.reset(seed=0)
    obs_pyt = torch.from_numpy(obs)

    def fragment():
        for t in range(n_steps):
            actions = actor.sample(obs_pyt[t:t + 1])[0].numpy()
            act[t + 1] = actions
            obs[t + 1], rew[t + 1], terminated, truncated, _ = env.step(
                actions)
            np.logical_or(terminated, truncated, out=done[t + 1])
        obs[0] = obs[n_steps]
    return fragment, env.close


def rollout_numpy(n_envs, n_steps):
    factory = functools.partial(gymnasium.make_vec, "CartPole-v1", n_envs,
                                vectorization_mode="vector_entry_point")
    feed = same.rollout(factory, _actor(torch.device("cpu")), n_steps,
                        n_envs, entropy=0, copy=False)
    return (lambda: next(feed)), feed.close


def _gymnax():
    """gymnax's CartPole and its parameters, or why not."""
    try:
        import gymnax
    except ImportError:
        return ("JAX or gymnax is missing "
                "(pip install -e 'path/to/rlplay[jax]')")
    return gymnax.make("CartPole-v1")


def hand_jax(n_envs, n_steps, device):
    """The hand-written loop over gymnax's CartPole: ``(fragment,
    close)``."""
    import jax
    import jax.numpy as jnp
    env, params = _gymnax()
    params = jax.tree.map(jnp.asarray, params)

    @jax.jit
    def reset(key):
        key, sub = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(sub, n_envs), params)
        return key, state, obs

    @jax.jit
    def step(key, state, action):
        key, sub = jax.random.split(key)
        obs, state, rew, done, _ = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(sub, n_envs), state, action, params)
        return key, state, obs, rew, done

    actor = _actor(device)
    obs, act, rew, done = _rows(n_envs, n_steps, device)
    carry = list(reset(jax.random.key(0)))
    obs[0] = torch.from_dlpack(carry[2])
    sync = _sync(device)

    def fragment():
        key, state = carry[:2]
        for t in range(n_steps):
            act[t + 1] = actor.sample(obs[t:t + 1])[0]
            key, state, x, r, d = step(
                key, state, jnp.from_dlpack(act[t + 1].to(torch.int32)))
            obs[t + 1] = torch.from_dlpack(x)
            rew[t + 1] = torch.from_dlpack(r)
            done[t + 1] = torch.from_dlpack(d)
        carry[:2] = key, state
        obs[0] = obs[n_steps]
        sync()
    return fragment, lambda: None


def rollout_jax(n_envs, n_steps, device):
    """``same.rollout`` over ``JaxSource(Gymnax(CartPole, n_envs))``."""
    from rlplay.envs import Gymnax, JaxSource
    env = Gymnax(*_gymnax(), num_envs=n_envs)
    feed = same.rollout(functools.partial(JaxSource, env), _actor(device),
                        n_steps, n_envs, entropy=0, copy=False)
    sync = _sync(device)

    def fragment():
        next(feed)
        sync()
    return fragment, feed.close


@functools.lru_cache(maxsize=None)
def _brax(name, backend):
    """Brax's env ``name`` on ``backend``, or why not (one object: the
    rounds share its compilations)."""
    try:
        from brax import envs
    except ImportError:
        return "Brax is missing (pip install -e 'path/to/rlplay[jax]')"
    return envs.get_environment(name, backend=backend)


@functools.lru_cache(maxsize=None)
def _brax_calls(name, backend, n_envs):
    """The hand loop's compiled reset and step (Brax's own training
    wrappers), and the adapter of the rlplay rows, made once a size."""
    import jax
    from brax.envs.wrappers import training

    from rlplay.envs import Brax
    env = _brax(name, backend)
    wrapped = training.wrap(env, episode_length=1000)
    return (jax.jit(wrapped.reset), jax.jit(wrapped.step),
            Brax(env, num_envs=n_envs))


def _gaussian(n_obs, n_actions, device):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GaussianActor(n_obs, n_actions).to(device)


def hand_brax(name, backend, n_envs, n_steps, device):
    """The hand-written loop over Brax's env with Brax's own wrappers:
    ``(fragment, close)``."""
    import jax
    import jax.numpy as jnp
    reset, step, adapter = _brax_calls(name, backend, n_envs)
    n_obs, = adapter.single_observation_space.shape
    n_actions, = adapter.single_action_space.shape
    actor = _gaussian(n_obs, n_actions, device)
    rows = (n_steps + 1, n_envs)
    obs = torch.zeros(rows + (n_obs,), device=device)
    act = torch.zeros(rows + (n_actions,), device=device)
    rew = torch.zeros(rows, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    carry = [reset(jax.random.split(jax.random.PRNGKey(0), n_envs))]
    obs[0] = torch.from_dlpack(carry[0].obs)
    sync = _sync(device)

    def fragment():
        state = carry[0]
        for t in range(n_steps):
            act[t + 1] = actor.sample(obs[t:t + 1])[0]
            state = step(state, jnp.from_dlpack(act[t + 1]))
            obs[t + 1] = torch.from_dlpack(state.obs)
            rew[t + 1] = torch.from_dlpack(state.reward)
            done[t + 1] = torch.from_dlpack(state.done) != 0
        carry[0] = state
        obs[0] = obs[n_steps]
        sync()
    return fragment, lambda: None


def rollout_brax(name, backend, n_envs, n_steps, device):
    """``same.rollout`` over ``JaxSource(Brax(env, n_envs))``."""
    from rlplay.envs import JaxSource
    *_, adapter = _brax_calls(name, backend, n_envs)
    n_obs, = adapter.single_observation_space.shape
    n_actions, = adapter.single_action_space.shape
    feed = same.rollout(functools.partial(JaxSource, adapter),
                        _gaussian(n_obs, n_actions, device), n_steps,
                        n_envs, entropy=0, copy=False)
    sync = _sync(device)

    def fragment():
        next(feed)
        sync()
    return fragment, feed.close


def _needs_brax(name, backend, run):
    def checked(seconds):
        missing = _brax(name, backend)
        return missing if isinstance(missing, str) else run(seconds)
    return checked


def _needs_gymnax(run):
    def checked(seconds):
        missing = _gymnax()
        return missing if isinstance(missing, str) else run(seconds)
    return checked


def _timed(make, steps):
    def run(seconds):
        fragment, close = make()
        try:
            return timed(fragment, steps, seconds)
        finally:
            close()
    return run


def _alternated(n_envs, n_steps, device, rollout=rollout_torch,
                hand=hand_torch):
    def run(seconds):
        loops = {"rlplay": rollout(n_envs, n_steps, device),
                 "hand": hand(n_envs, n_steps, device)}
        # each call's CPU time too (this thread's): on a machine that other
        # work loads, the wall time of a call includes the time the thread
        # waited for a core
        spent = dict.fromkeys(loops, 0.0)

        def clocked(name, fragment):
            def call():
                tic = time.thread_time()
                fragment()
                spent[name] += time.thread_time() - tic
            return call
        try:
            result = alternated({k: clocked(k, v[0])
                                 for k, v in loops.items()},
                                n_steps * n_envs, seconds)
        finally:
            for _, close in loops.values():
                close()
        # the warm-up calls are clocked too, the same count for both
        return dict(result["rlplay"], x_hand=result["rlplay"]["steps_per_s"]
                    / result["hand"]["steps_per_s"],
                    x_hand_cpu=spent["hand"] / spent["rlplay"])
    return run


def rows(sizes, n_steps, device, brax=None, brax_backend="mjx"):
    out = []
    for n in sizes:
        steps = n * n_steps
        tag = f"torch.{n}" + ("" if device.type == "cpu" else f".{device}")
        out += [
            Row(f"{tag}/hand", _timed(functools.partial(
                hand_torch, n, n_steps, device), steps)),
            Row(f"{tag}/same.rollout", _timed(functools.partial(
                rollout_torch, n, n_steps, device), steps)),
            Row(f"{tag}/same.rollout.alternating",
                _alternated(n, n_steps, device)),
            Row(f"numpy.{n}/hand", _timed(functools.partial(
                hand_numpy, n, n_steps), steps)),
            Row(f"numpy.{n}/same.rollout", _timed(functools.partial(
                rollout_numpy, n, n_steps), steps)),
        ]
        # JAX on its default device, the actor on the CPU
        cpu = torch.device("cpu")
        out += [
            Row(f"jax.{n}/hand", _needs_gymnax(_timed(functools.partial(
                hand_jax, n, n_steps, cpu), steps))),
            Row(f"jax.{n}/same.rollout", _needs_gymnax(_timed(
                functools.partial(rollout_jax, n, n_steps, cpu), steps))),
            Row(f"jax.{n}/same.rollout.alternating", _needs_gymnax(
                _alternated(n, n_steps, cpu, rollout_jax, hand_jax))),
        ]
        if brax:
            # Brax on JAX's default device, the actor on the torch rows'
            tag = f"brax.{brax}.{n}"
            hand = functools.partial(hand_brax, brax, brax_backend)
            rollout = functools.partial(rollout_brax, brax, brax_backend)
            out += [
                Row(f"{tag}/hand", _needs_brax(brax, brax_backend, _timed(
                    functools.partial(hand, n, n_steps, device), steps))),
                Row(f"{tag}/same.rollout", _needs_brax(
                    brax, brax_backend, _timed(functools.partial(
                        rollout, n, n_steps, device), steps))),
                Row(f"{tag}/same.rollout.alternating", _needs_brax(
                    brax, brax_backend,
                    _alternated(n, n_steps, device, rollout, hand))),
            ]
    return out


def records(selected, results):
    """One record a row: steps/s, and ``x_hand`` (paired with the hand
    loop of its section, round by round; the alternating row's own)."""
    out = []
    for row in selected:
        values = results.get(row.name)
        if not values:
            continue
        item = record(row.name, row.kind, {
            r: v["steps_per_s"] for r, v in values.items()})
        section = row.name.split("/")[0]
        if row.name.endswith(".alternating"):
            ratios = [v["x_hand"] for v in values.values()]
            mid, low, high = stats([v["x_hand_cpu"]
                                    for v in values.values()])
            item.update(x_hand_cpu=mid, x_hand_cpu_min=low,
                        x_hand_cpu_max=high)
        else:
            ratios = paired(
                {r: v["steps_per_s"] for r, v in values.items()},
                {r: v["steps_per_s"] for r, v in results.get(
                    f"{section}/hand", {}).items()})
        if ratios:
            mid, low, high = stats(ratios)
            item.update(x_hand=mid, x_hand_min=low, x_hand_max=high)
        out.append(item)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=1.0,
                        help="seconds each row is timed per round")
    parser.add_argument("--sizes", default="1024,8192",
                        help="numbers of envs, comma-separated")
    parser.add_argument("--steps", type=int, default=64,
                        help="rows per fragment")
    parser.add_argument("--device", default="cpu",
                        help="where the torch rows run (cuda: the actor too)")
    parser.add_argument("--brax", default=None,
                        help="rows of this Brax env too (halfcheetah)")
    parser.add_argument("--brax-backend", default="mjx",
                        help="the Brax rows' physics pipeline")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/torch_envs.py: no GPU on this machine (CUDA is "
              "absent): the torch rows run on the CPU only")
        device = torch.device("cpu")
    elif device.type == "cpu" and not torch.cuda.is_available():
        print("benchmarks/torch_envs.py: no GPU on this machine: CPU rows "
              "only (--device cuda measures them on a GPU where present)")
    sizes = [int(n) for n in args.sizes.split(",")]
    selected = rows(sizes, args.steps, device, args.brax, args.brax_backend)
    results, skipped, failed = measure(selected, args.rounds, args.duration)
    table = records(selected, results)
    table += [{"name": name, "skipped": why}
              for name, why in {**skipped, **failed}.items()]
    if args.json:
        print_json(table)
        return 1 if failed else 0
    print(f"{'row':<36} {'steps/s [min-max]':<29} x hand [min-max]")
    for item in table:
        if "skipped" in item:
            print(f"{item['name']:<36} skipped: {item['skipped']}")
            continue
        ratio = fmt(item.get("x_hand"))
        if "x_hand" in item:
            ratio += f" [{item['x_hand_min']:.2f}-{item['x_hand_max']:.2f}]"
        if "x_hand_cpu" in item:
            ratio += (f"  (CPU time: {item['x_hand_cpu']:.2f} "
                      f"[{item['x_hand_cpu_min']:.2f}-"
                      f"{item['x_hand_cpu_max']:.2f}])")
        print(f"{item['name']:<36} {spread(item)} {ratio}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
