"""The fleet of a served ``multi.rollout`` (``serve=True``): the worker
processes of :class:`~.multi.Processes`, and one inference server that
runs the actor for all of them (:mod:`rlplay.engine.workers._server`,
where the protocol and its timeline are drawn)."""
import functools
import math
import numbers

from ..devices import worker_devices
from ..nested import suply
from ..workers import (SERVED_STATS, ServedSupervisor, ServeOptions,
                       SharedBuffers)
from ._stats import Stats

__all__ = ["Served", "ServedStats", "check_serving"]


def check_serving(serve, groups, deadline, n_per_actor):
    """The served mode's keywords, checked up front.

    Raises
    ------
    TypeError, ValueError
        Naming the keyword and the value given.
    """
    if not isinstance(serve, bool):
        raise TypeError(f"serve must be True or False, got {serve!r}")
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) \
            or groups < 1:
        raise ValueError(f"groups must be an int of at least 1, got "
                         f"{groups!r}")
    if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(
                deadline, numbers.Real) or not 0 < deadline < math.inf):
        raise ValueError(f"deadline must be None (lock-step) or a finite "
                         f"number of seconds above 0, got {deadline!r}")
    if not serve and (groups != 1 or deadline is not None):
        raise ValueError(f"groups={groups!r} and deadline={deadline!r} are "
                         f"settings of the served mode: give serve=True")
    if n_per_actor % groups:
        raise ValueError(f"groups={groups} must divide n_per_actor="
                         f"{n_per_actor} (each group steps n_per_actor / "
                         f"groups envs)")


class ServedStats(Stats):
    """:class:`~._stats.Stats` and the server's counters
    (:data:`~rlplay.engine.workers.SERVED_STATS`: ``served_calls``, the
    actor's calls; ``served_rows``, the env rows they computed;
    ``time_serve_busy``, the server's seconds serving and
    ``time_serve_forward``, those in the actor's calls, with the copy of
    their outputs to the host from a device), with
    ``served_mean_rows``, the rows of an average call; read at each
    batch."""

    def __init__(self, workers, counters):
        super().__init__(workers)
        self._counters = counters
        self.update({name: 0 for name in SERVED_STATS})
        self["served_mean_rows"] = 0.0

    def batch(self, npy, **kwargs):
        super().batch(npy, **kwargs)
        self.update(zip(SERVED_STATS, self._counters[:]))
        self["served_calls"] = int(self["served_calls"])
        self["served_rows"] = int(self["served_rows"])
        self["served_mean_rows"] = self["served_rows"] / max(
            self["served_calls"], 1)


class Served:
    """The fleet of a served ``multi`` (see :mod:`._gather`): worker
    processes filling a pool of shared buffers, their actions computed by
    one inference server on ``actor_device``."""

    def __init__(self, processes, groups, deadline, max_lag=None):
        self.processes, self.context = processes, processes.context
        self.groups, self.deadline = groups, deadline
        self.max_lag = max_lag
        self.device = None

    def devices(self, actor_device, n_actors):
        """The server's device (kept), checked; the workers keep a CPU
        copy of the actor (for its ``reset``): ``None``."""
        if isinstance(actor_device, (list, tuple)):
            raise ValueError(f"actor_device={actor_device!r}: the served "
                             f"mode runs the actor on one device")
        device = worker_devices(
            "cpu" if actor_device is None else actor_device, 1,
            start_method=self.context.get_start_method())
        self.device = device[0]
        return None

    def check_capacity(self, template, n_actors, n_buffers):
        self.processes.check_capacity(template, n_actors, n_buffers)

    def start(self, supervision, actor, spec, template, n_actors,
              n_buffers, owner):
        ctx, run = self.context, supervision.setup.run
        size, hx_dim = spec.n_envs // self.groups, getattr(actor, "hx_dim", 1)
        hx = suply(lambda x: x.narrow(hx_dim, 0, size), template.hx)
        options = ServeOptions(
            groups=self.groups, deadline=self.deadline, device=self.device,
            actor=spec.actor, entropy=spec.entropy, hx=hx, hx_dim=hx_dim,
            share=self.max_lag is None)
        counters = ctx.Array("d", len(SERVED_STATS), lock=False)
        what = f"a pool of {n_buffers} buffers for {n_actors} workers"
        supervision.workers(
            ctx, n_actors, actor, lambda params: SharedBuffers(
                template, n_buffers, n_actors, spec, params, what=what,
                start_method=ctx.get_start_method(), run=run),
            name="rlplay-multi",
            stats=lambda accounts: ServedStats(accounts, counters),
            supervisor=functools.partial(ServedSupervisor, options=options,
                                         counters=counters))
