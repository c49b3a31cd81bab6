"""Checkpoint and resume: what rlplay owns of a run, saved and continued.

Every generator's ``state_dict()`` is a small dict of plain values (ints,
strings, lists; ``torch.save``-able and loadable with
``torch.load(weights_only=True)``)::

    format      "rlplay.run/1"
    kind        "same", "single", "multi", "cluster" or "evaluator"
    settings    {name: value}: the arguments that shape the batch
                (n_steps, the env counts, sticky...)
    layout      {"spaces": [observation, action] (their reprs),
                 "buffer": [[path, shape, dtype], ...]}: one fragment
                buffer, which the actor's outputs (act, info, hx) shape too
                (None for the evaluator)
    seeds       {"entropy", "spawn_key", "pool_size"}: the run's root
                ``SeedSequence`` (this rank's); "resumes": how many times
                it was resumed
    rank        the rank of the process whose run it is, and the
    world_size  number of ranks then (``torch.distributed``'s: 0 and 1
                for a run of one process, or a state saved before them)
    counters    the generator's stats counters (steps, batches, version,
                dropped, restarts, the times)
    version     the parameter version a continuation starts at
    workers     per worker {"seq": the meta.seq of its next fragment,
                "generation": its generation, "restarts": its count}
    extra       what one generator keeps besides (the evaluator's count)
    calls       every ``call_envs`` call, in order: [{"method": name,
                "payload": base64 of the cloudpickled call}]; a
                continuation applies them all before collecting (so
                resume only states you trust). A state without them
                (saved before ``call_envs``) continues with none: control 0

A continuation (``resume=state``, the other arguments as they were) is
resume number ``r + 1`` of the run: its envs, workers and torch streams
draw from the branch ``(RESUME_BRANCH, r + 1)`` of the run's seeding tree
(:func:`rlplay.engine.seeds.resume_root`), laid out as a whole run's tree,
so no env stream repeats a seed of the run before it, and two resumes
from one state draw the same seeds (and agree). Each worker goes on with
the ``meta.seq`` after the last fragment that was delivered (those it
collected and the learner never got are collected anew, by new envs) and
with the next ``meta.generation``, which tells every consumer of fragments
(:mod:`rlplay.engine.lanes`) that its row 0 does not continue the row T
before it: the envs start from fresh resets. The parameter version starts
at the number of batches delivered so far (the parameters that the
learner holds then; the evaluator's, at the last version submitted), and
the counters go on. ``restarts`` is a budget for
the whole run, resumes included (raise it on resume to allow more).

Many learners (``torch.distributed``): each rank's generator draws from
the rank's own root (:func:`rlplay.engine.seeds.rank_root`), and its
``state_dict()`` is that rank's. A state is resumed by the rank that
saved it, and refused elsewhere with a ``ValueError`` naming both ranks:
resumed by another rank, it would collect what that rank collects (its
seeds come from the saved root), and the two ranks' data would repeat
each other. The world size may change between the runs (an elastic
restart): a rank's tree does not depend on it, so each rank that has a
state resumes its own, and a new rank starts afresh, with seeds of its
own.

A state whose ``settings`` or ``layout`` differ from those of the new
generator is refused with a ``ValueError`` that names what differs, before
any worker starts (the layout once the probe env and the actor's virtual
call have told it). So is a damaged state (:func:`check_state`): a key
missing, a container or a value of another type (``TypeError``), a count
below 0 (``ValueError``); each message names ``resume``, the path of the
entry and the value found there.
"""
import numbers

import numpy as np

from ..core import Fragment
from ..seeds import current_rank, rank_root, resume_root
from ..workers import saved_calls

__all__ = ["FORMAT", "Continuation", "continuation", "check_state",
           "buffer_layout", "counters", "restore_counters"]

FORMAT = "rlplay.run/1"

# the rows of the buffer added since the format began: a state saved
# before them lacks them and is continued as one that had them (the
# acted flags the loop writes; a run without call_envs calls:
# meta.control 0; meta.agent, 0 but for PettingZoo sources)
_ADDED_ROWS = ("batch.acted", "batch.meta.control", "batch.meta.agent")

# the stats counters that a continuation goes on from
_COUNTERS = ("steps", "batches", "time_collect", "time_wall",
             "time_learner_wait", "time_worker_wait", "time_collate",
             "dropped", "restarts", "version", "evaluations",
             "time_evaluate")


class Continuation:
    """Where a run (a fresh one, or resume number ``resumes``) starts.

    Attributes
    ----------
    root : SeedSequence
        The run's own root (of its first part), this rank's.
    rank, world_size : int
        This process's in a distributed run (``(0, 1)`` alone).
    resumes : int
    entropy : SeedSequence
        The root this part of the run draws every seed from.
    seq, generation, restarts : list of int
        Per worker: the ``meta.seq`` of its first fragment, its
        generation, its replacements so far.
    version : int
        The parameter version to start at.
    counters : dict
        The stats counters to go on from (empty for a fresh run).
    extra : dict
    calls : list of (name, payload)
        The ``call_envs`` calls made so far (:mod:`rlplay.engine.workers._control`).
    saved : dict or None
        The state resumed from.
    """

    def __init__(self, root, n_workers, saved=None, rank=(0, 1)):
        self.root, self.saved = root, saved
        self.rank, self.world_size = rank
        self.resumes = 0 if saved is None else saved["seeds"]["resumes"] + 1
        self.entropy = resume_root(root, self.resumes)
        if saved is None:
            self.seq, self.generation = [0] * n_workers, [0] * n_workers
            self.restarts = [0] * n_workers
            self.version, self.counters, self.extra = 0, {}, {}
            self.calls = []
        else:
            workers = saved["workers"]
            self.seq = [int(w["seq"]) for w in workers]
            self.generation = [int(w["generation"]) + 1 for w in workers]
            self.restarts = [int(w["restarts"]) for w in workers]
            self.version = int(saved["version"])
            self.counters = dict(saved["counters"])
            self.extra = dict(saved.get("extra", {}))
            self.calls = saved_calls(saved)

    def seeds(self):
        """The ``seeds`` entry of a state."""
        root = self.root
        entropy = root.entropy  # an int, or a sequence of them
        return {"entropy": int(entropy) if np.ndim(entropy) == 0
                else [int(e) for e in entropy],
                "spawn_key": [int(k) for k in root.spawn_key],
                "pool_size": int(root.pool_size), "resumes": self.resumes}

    def check_layout(self, layout):
        """Refuse a saved state laid out otherwise than ``layout`` (a
        :func:`buffer_layout`): a ``ValueError`` naming the first
        difference."""
        if self.saved is None:
            return
        saved = self.saved["layout"]
        if saved is None:  # an evaluator's, which fills no buffer
            raise ValueError(
                f"resume['layout'] is None (an evaluator's state, whose "
                f"evaluations fill no batch), but this generator shapes its "
                f"batches: resume it from a state of its own kind")
        names = ("observation space", "action space")
        for name, old, new in zip(names, saved["spaces"], layout["spaces"]):
            if old != new:
                raise ValueError(
                    f"resume: the envs' {name} is {new}, but the saved run's "
                    f"was {old}: a continuation must shape its batches as "
                    f"the run it continues")
        old = {path: (shape, dtype) for path, shape, dtype in saved["buffer"]}
        new = {path: (shape, dtype) for path, shape, dtype in layout["buffer"]}
        for path in _ADDED_ROWS:  # a state saved before they were
            if path in new:
                old.setdefault(path, new[path])
        for path in sorted(old.keys() | new.keys()):
            if old.get(path) != new.get(path):
                raise ValueError(
                    f"resume: the batch's {path} is {_shown(new.get(path))}, "
                    f"but the saved run's was {_shown(old.get(path))} (the "
                    f"envs' spaces and the actor's outputs shape it): a "
                    f"continuation must shape its batches as the run it "
                    f"continues")

    def state(self, kind, settings, layout, stats, version, workers,
              extra=None, calls=()):
        """A ``state_dict()`` (see the module docstring): ``workers`` is a
        list of ``(seq, generation, restarts)``, ``calls`` the entry of
        :meth:`~rlplay.engine.workers._control.CallLog.state`."""
        return {"format": FORMAT, "kind": kind, "settings": dict(settings),
                "layout": layout, "seeds": self.seeds(),
                "rank": int(self.rank), "world_size": int(self.world_size),
                "counters": counters(stats), "version": int(version),
                "workers": [{"seq": int(seq), "generation": int(generation),
                             "restarts": int(restarts)}
                            for seq, generation, restarts in workers],
                "extra": dict(extra or {}), "calls": list(calls)}


def _shown(entry):
    # a buffer leaf (shape, dtype) in a message
    return "absent" if entry is None else f"{tuple(entry[0])} {entry[1]}"


def continuation(resume, entropy, kind, settings, n_workers):
    """The :class:`Continuation` of a generator made with ``resume`` (a
    state, or ``None`` for a fresh run) and ``entropy``.

    The root of a fresh run is this rank's
    (:func:`~rlplay.engine.seeds.rank_root`). Checks ``resume`` up front,
    before anything starts: a state of another kind, of another format,
    with other ``settings``, of another rank or another ``entropy`` (where
    one is given) is refused.

    Raises
    ------
    TypeError, ValueError
        Naming what differs.
    """
    rank = current_rank()
    if resume is None:
        return Continuation(rank_root(entropy, rank[0]), n_workers,
                            rank=rank)
    if not isinstance(resume, dict) or resume.get("format") != FORMAT:
        raise TypeError(
            f"resume must be a generator's state_dict() (a dict of format "
            f"{FORMAT!r}), got "
            + (f"a dict of format {resume.get('format')!r}"
               if isinstance(resume, dict) else type(resume).__name__))
    check_state(resume)
    if resume["kind"] != kind:
        raise ValueError(f"resume holds the state of a {resume['kind']} run, "
                         f"which a {kind} generator cannot continue")
    saved = resume["settings"]
    for name, value in settings.items():
        if saved.get(name) != value:
            raise ValueError(
                f"resume: {name}={value!r}, but the saved run had {name}="
                f"{saved.get(name)!r}: a continuation takes the arguments of "
                f"the run it continues")
    if len(resume["workers"]) != n_workers:
        raise ValueError(f"resume: the saved run had {len(resume['workers'])} "
                         f"workers, this one {n_workers}")
    saved_rank = resume.get("rank", 0)
    if saved_rank != rank[0]:
        raise ValueError(
            f"resume holds the state of rank {saved_rank} (of a world of "
            f"{resume.get('world_size', 1)}), but this process is rank "
            f"{rank[0]} (of {rank[1]}): each rank resumes its own state (with "
            f"another rank's, it would collect what that rank collects)")
    seeds = resume["seeds"]
    root = np.random.SeedSequence(seeds["entropy"],
                                  spawn_key=tuple(seeds["spawn_key"]),
                                  pool_size=seeds["pool_size"])
    if entropy is not None:
        given = rank_root(entropy, rank[0])
        if (given.entropy != root.entropy
                or tuple(given.spawn_key) != tuple(root.spawn_key)):
            raise ValueError(
                f"resume: entropy={entropy!r}, but the saved run's root was "
                f"{root!r}: pass the run's entropy or None (the saved one "
                f"is used)")
    return Continuation(root, n_workers, saved=resume, rank=rank)


def _entry(parent, key, path, types, what):
    # parent[key], which must be of ``types``: else a TypeError naming it
    if key not in parent:
        raise ValueError(f"resume{path} is missing: a generator's "
                         f"state_dict() holds it ({what})")
    value = parent[key]
    if not isinstance(value, types):
        raise TypeError(f"resume{path} must be {what}, got {value!r}")
    return value


def _count(parent, key, path, least=0):
    # an int of at least ``least`` (not a bool, a float or a string)
    value = parent[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"resume{path} must be an int, got {value!r}")
    if value < least:
        raise ValueError(f"resume{path} must be at least {least}, got "
                         f"{value!r}")
    return int(value)


def _ints(values, path, least=0):
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"resume{path} must be a list of ints, got "
                        f"{values!r}")
    return [_count(dict(enumerate(values)), i, f"{path}[{i}]", least)
            for i in range(len(values))]


def check_state(resume):
    """Refuse a damaged state (a key missing, an entry of another type, a
    count below 0) before anything reads it.

    Parameters
    ----------
    resume : dict
        A ``state_dict()`` of the format :data:`FORMAT`.

    Raises
    ------
    ValueError
        An entry missing, or out of its range; the message names
        ``resume``, the entry's path and the value given.
    TypeError
        An entry of another type, named as above.
    """
    _entry(resume, "kind", "['kind']", str, "a generator's kind")
    _entry(resume, "settings", "['settings']", dict, "a dict of arguments")
    layout = _entry(resume, "layout", "['layout']", (dict, type(None)),
                    "a dict (None for the evaluator)")
    if layout is not None:
        spaces = _entry(layout, "spaces", "['layout']['spaces']",
                        (list, tuple), "a list of the spaces' reprs")
        if len(spaces) != 2 or not all(isinstance(s, str) for s in spaces):
            raise TypeError(f"resume['layout']['spaces'] must be the reprs "
                            f"of the observation and the action spaces, got "
                            f"{spaces!r}")
        rows = _entry(layout, "buffer", "['layout']['buffer']",
                      (list, tuple), "a list of [path, shape, dtype]")
        for i, row in enumerate(rows):
            where = f"['layout']['buffer'][{i}]"
            if not (isinstance(row, (list, tuple)) and len(row) == 3
                    and isinstance(row[0], str) and isinstance(row[2], str)):
                raise TypeError(f"resume{where} must be [path, shape, "
                                f"dtype], got {row!r}")
            _ints(row[1], f"{where}[1]")
    seeds = _entry(resume, "seeds", "['seeds']", dict,
                   "a dict of the run's root seed sequence")
    entropy = _entry(seeds, "entropy", "['seeds']['entropy']",
                     (numbers.Integral, list, tuple),
                     "an int or a list of ints")
    if isinstance(entropy, (list, tuple)):
        _ints(entropy, "['seeds']['entropy']")
    else:
        _count(seeds, "entropy", "['seeds']['entropy']")
    _entry(seeds, "spawn_key", "['seeds']['spawn_key']", (list, tuple),
           "a list of ints")
    _ints(seeds["spawn_key"], "['seeds']['spawn_key']")
    _entry(seeds, "pool_size", "['seeds']['pool_size']", numbers.Integral,
           "an int")
    _count(seeds, "pool_size", "['seeds']['pool_size']", least=4)
    _entry(seeds, "resumes", "['seeds']['resumes']", numbers.Integral,
           "an int")
    _count(seeds, "resumes", "['seeds']['resumes']")
    counters = _entry(resume, "counters", "['counters']", dict,
                      "a dict of the stats counters")
    for key, value in counters.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not 0 <= value < float("inf"):
            raise (TypeError if not isinstance(value, numbers.Real)
                   or isinstance(value, bool) else ValueError)(
                f"resume['counters'][{key!r}] must be a finite number of "
                f"at least 0, got {value!r}")
    for key in ("rank", "world_size"):  # absent: saved before them
        if key in resume:
            _entry(resume, key, f"[{key!r}]", numbers.Integral, "an int")
            _count(resume, key, f"[{key!r}]", least=int(key == "world_size"))
    _entry(resume, "version", "['version']", numbers.Integral, "an int")
    _count(resume, "version", "['version']")
    workers = _entry(resume, "workers", "['workers']", (list, tuple),
                     "a list of one dict per worker")
    for i, worker in enumerate(workers):
        if not isinstance(worker, dict):
            raise TypeError(f"resume['workers'][{i}] must be a dict of seq, "
                            f"generation and restarts, got {worker!r}")
        for key in ("seq", "generation", "restarts"):
            where = f"['workers'][{i}][{key!r}]"
            _entry(worker, key, where, numbers.Integral, "an int")
            _count(worker, key, where)
    if "extra" in resume:
        extra = _entry(resume, "extra", "['extra']", dict, "a dict")
        if "requests" in extra:  # the evaluator's count
            _count(extra, "requests", "['extra']['requests']")
    saved_calls(resume)  # absent: none


def buffer_layout(template, observation_space, action_space):
    """The ``layout`` entry of a state: the spaces' reprs and every leaf of
    one fragment buffer ``template`` (tensors or arrays) as ``[path,
    shape, dtype]``."""
    rows = []

    def walk(node, path):
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            for name, child in zip(node._fields, node):
                walk(child, f"{path}.{name}")
        elif isinstance(node, dict):
            for name, child in node.items():
                walk(child, f"{path}[{name!r}]")
        elif isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]")
        elif node is not None:
            rows.append([path, [int(n) for n in node.shape],
                         str(node.dtype).replace("torch.", "")])

    assert isinstance(template, Fragment)
    walk(template, "batch")
    return {"spaces": [repr(observation_space), repr(action_space)],
            "buffer": rows}


def counters(stats):
    """The counters of ``stats`` that a continuation goes on from."""
    return {key: stats[key] for key in _COUNTERS if key in stats}


def restore_counters(stats, saved):
    """Set ``stats``'s counters to the ``saved`` ones (the times go on
    from where they were)."""
    for key in _COUNTERS:
        if key in saved and key in stats:
            stats[key] = saved[key]
    if hasattr(stats, "resumed"):
        stats.resumed(saved.get("time_wall", 0.0))
