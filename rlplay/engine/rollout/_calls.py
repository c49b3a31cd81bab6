"""``call_envs``, the generators' side of env control (the whole story:
:mod:`rlplay.engine.workers._control`).

:func:`call_envs` is one method of every generator (and of the evaluator),
given to each class as ``call_envs = call_envs``: it adds the call to the
generator's :class:`~rlplay.engine.workers.CallLog`, which its set-up
(:class:`~._base.SetUp`) made, ``self._setup.calls``.
"""
from ._states import Status

__all__ = ["call_envs"]


def call_envs(self, name, /, *args, **kwargs):
    """Have every env of every worker call its method ``name(*args,
    **kwargs)`` at that worker's next fragment boundary.

    The call is published with the parameters by the next ``next()``
    (the evaluator's ``submit()``), so it is first seen with the same
    lag as they are (``same``: in the next batch; ``single``: in the
    one after; ``multi`` and ``cluster``: from each worker's next
    fragment, or the one after for a worker still busy with calls
    sent before); every fragment says how many calls its envs had
    applied before it (``meta.control``), never changing within a
    fragment. Workers that start later (restarts, a resumed run)
    apply every call before their first reset. See
    docs/how-to/changing-envs.md.

    Parameters
    ----------
    name : str
        A method of the envs (found through their wrappers, or each
        env's through ``VectorEnv.call``; a PettingZoo env's, once
        for all its agents); not ``reset``, ``step`` or ``close``.
    *args, **kwargs
        Its arguments, cloudpickled once here (at most
        :data:`~rlplay.engine.workers.MAX_CALL_BYTES`).

    Returns
    -------
    control : int
        The number of this call (1 for the first): fragments with
        ``meta.control >= control`` (evaluations with
        ``Evaluation.control >= control``) were collected after it.
        Not the envs' return values: those would be a round trip
        that waits for every worker to reach a fragment boundary (a
        whole fragment, on every node), stalling the learner that
        collection is there to keep busy; and a replacement calls
        again. What the envs should report, they report in their
        observations or info (``env_info=``), stamped per fragment.

    Raises
    ------
    TypeError
        ``name`` is not a str, the arguments do not pickle, or the
        envs' source cannot take calls (EnvPool), each named (the
        evaluator makes no env here: its worker reports EnvPool at
        the next ``submit``, as a failing call).
    ValueError
        ``name`` is not a method's name, or is refused; the arguments
        are too large.
    RuntimeError
        The generator is closed (or the error that broke it).
    """
    if self.status is Status.BROKEN:
        raise self._error
    if self.status is Status.CLOSED:
        raise RuntimeError(f"call_envs: the {type(self).__name__} is "
                           f"closed")
    return self._setup.calls.add(name, args, kwargs)
