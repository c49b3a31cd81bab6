"""What a replay buffer returns: the n-step transitions of indices and the
windows of a sequence sampler, gathered from the nodes (numpy), and their
move to the buffer's device."""
from typing import Any, NamedTuple

import numpy as np
import torch

from ...nested import suply
from ..returns import n_step as _n_step
from ._nodes import GOES_ON, TERMINATED, TRUNCATED


class Transitions(NamedTuple):
    """A batch of sampled transitions (tensors; ``weight``
    is ``None`` but for :class:`PrioritizedReplay`):

    ====================  ==================================================
    ``obs``               the observations the actions were taken at
    ``act``               the actions
    ``rew``               float32, the discounted sum of the ``k`` rewards of
                          the window
    ``next_obs``          the observation reached after ``k`` steps (the true
                          final observation where the episode ended)
    ``discount``          float32, ``gamma**k``, 0 after a termination:
                          the target is ``rew + discount * V(next_obs)``
    ``info``              the actor's info at ``obs``
    ``version``           int64, the parameter version that chose ``act``
    ``index``             int64, the transitions' indices (for ``update``)
    ``weight``            float32, importance weights (prioritized only)
    ====================  ==================================================
    """
    obs: Any
    act: Any
    rew: Any
    next_obs: Any
    discount: Any
    info: Any
    version: Any
    index: Any
    weight: Any

Transitions.__module__ = "rlplay.engine.replay"


class Sequences(NamedTuple):
    """Windows for a recurrent actor, time-major; see
    :meth:`Replay.sample_sequences`."""
    obs: Any
    act: Any
    rew: Any
    fin: Any
    truncated: Any
    mask: Any
    info: Any
    version: Any
    hx: Any
    index: Any

Sequences.__module__ = "rlplay.engine.replay"


def _take(tree, rows):
    """``tree``'s leaves at ``rows`` (fresh arrays)."""
    if type(tree) is np.ndarray:
        return tree[rows]
    return suply(lambda x: x[rows], tree)


def transitions(nodes, index, n_step, gamma):
    """The ``n_step`` transitions of ``index`` (numbers of nodes held with
    a successor), as numpy arrays; ``weight`` is ``None``."""
    store, C = nodes.store, nodes.capacity
    slots = index % C
    nxt, end, rew = store["next"], store["end"], store["rew"]
    first = nxt[slots] % C
    if n_step == 1:
        reached = first
        G = rew[first]
        discount = np.full(len(index), gamma, np.float32)
    else:
        steps = np.empty((n_step, len(index)), np.int64)
        rews = np.empty((n_step, len(index)), np.float32)
        cuts = np.empty((n_step, len(index)), bool)
        at = first
        for k in range(n_step):
            steps[k], rews[k] = at, rew[at]
            after = nxt[at]
            cuts[k] = (end[at] != GOES_ON) | (after < 0)
            at = np.where(cuts[k], at, after % C)
        G, discount, last = _n_step(rews, cuts, np.float32(gamma))
        reached = steps[last, np.arange(len(index))]
    discount[end[reached] == TERMINATED] = 0.0
    data = store["data"]
    return Transitions(
        obs=_take(data["obs"], slots), act=_take(data["act"], first),
        rew=G, next_obs=_take(data["obs"], reached), discount=discount,
        info=_take(data["info"], slots), version=store["version"][first],
        index=index, weight=None)


def sequences(nodes, pick, rows, mask):
    """The windows of :func:`._samplers.draw_windows` as numpy arrays,
    laid out as a fragment's rows (zeros past each window's end)."""
    store = nodes.store
    end = store["end"][rows]
    data = store["data"]

    def pad(x):
        return np.where(mask.reshape(*mask.shape, *[1] * (x.ndim - 2)),
                        x, np.zeros((), x.dtype))
    dim = nodes.hx_dim
    hx = suply(lambda h: np.ascontiguousarray(np.moveaxis(h[pick], 0, dim)),
               nodes.hx["data"])
    return Sequences(
        obs=suply(lambda x: pad(x[rows]), data["obs"]),
        act=suply(lambda x: pad(x[rows]), data["act"]),
        rew=pad(store["rew"][rows]),
        fin=mask & (end != GOES_ON),
        truncated=mask & (end == TRUNCATED),
        mask=mask,
        info=suply(lambda x: pad(x[rows]), data["info"]),
        version=pad(store["version"][rows]),
        hx=hx,
        index=nodes.hx["node"][pick])


def to_device(out, device, pinned):
    """A namedtuple of numpy arrays (fresh, from a gather; ``None`` kept)
    as tensors on ``device`` (through pinned memory if ``pinned``)."""
    def move(x):
        x = torch.from_numpy(x)
        if device is None or device.type == "cpu":
            return x
        if pinned:
            return x.pin_memory().to(device, non_blocking=True)
        return x.to(device)
    return type(out)(*(
        None if field is None else move(field)
        if type(field) is np.ndarray else suply(move, field)
        for field in out))
