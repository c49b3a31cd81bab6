"""The Minari export of whole episodes: :func:`record`
(``rlplay.engine.rollout.episodic.record``), which writes the episodes of
any generator of fragments into a new Minari dataset (``rlplay[minari]``),
after checking the dataset id before the first batch is collected.
"""
import os
import re

import numpy as np

from ..core.layout import check_count
from ..nested import suply
from ._episodes import MAX_LENGTH, Episodic

__all__ = ["record"]


def record(feed, dataset_id, n_episodes, *, env=None, observation_space=None,
           action_space=None, max_length=MAX_LENGTH, batch_episodes=16,
           **minari_kwargs):
    """Write ``n_episodes`` whole episodes of ``feed`` (any generator of
    fragments) into a new Minari dataset; needs ``rlplay[minari]``.

    Each episode is stored as Minari stores one: observations with the
    true last one (``L + 1``), actions, rewards, terminations and
    truncations (``L``); its ``infos`` hold ``version_first`` and
    ``version_last`` (``L + 1`` copies each), the parameter versions that
    collected it, and ``worker`` and ``env``, where it came from. Episodes
    are numbered in the order they complete. The dataset is written where
    Minari writes datasets (``MINARI_DATASETS_PATH``) and read back with
    ``minari.load_dataset(dataset_id)``. ``feed`` is not closed.

    Parameters
    ----------
    feed : iterable of Fragment
        As :func:`~.episodic.episodes`'.
    dataset_id : str
        Minari's id, ``(namespace/)name-v(version)``, e.g.
        ``"cartpole/rlplay-v0"`` (letters, digits, ``-`` and ``_``, the
        version required), of a dataset that does not exist yet: checked
        before the first episode is collected; nothing is written outside
        the datasets path.
    n_episodes : int
    env : str or gymnasium.Env or EnvSpec, optional
        The env the dataset comes from (Minari keeps its spec); or give
        both ``observation_space`` and ``action_space`` (single-env
        spaces).
    max_length, batch_episodes : int
        As :func:`~.episodic.episodes`' ``max_length`` and
        ``n_episodes``: episodes are pulled ``batch_episodes`` at a time.
    **minari_kwargs
        Passed to ``minari.create_dataset_from_buffers``
        (``algorithm_name``, ``author``, ``description``, ...;
        ``data_format`` is ``"arrow"`` unless given).

    Returns
    -------
    minari.MinariDataset

    Raises
    ------
    TypeError, ValueError
        A ``dataset_id`` not of that form, or of a dataset that exists,
        before anything is collected.
    """
    _check_dataset_id(dataset_id)
    check_count("n_episodes", n_episodes)
    check_count("batch_episodes", batch_episodes)
    if env is None and (observation_space is None or action_space is None):
        raise ValueError("record needs env= (an env, its id or its spec) "
                         "or both observation_space= and action_space=")
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
    except ImportError as exc:
        raise ImportError("record needs Minari: pip install -e "
                          "'path/to/rlplay[minari]' (rlplay's clone with "
                          "its minari extra), or pip install "
                          "'minari[arrow]>=0.5'") from exc
    _check_new_dataset(dataset_id)
    source = Episodic(feed, min(batch_episodes, n_episodes),
                      max_length=max_length)
    buffers = []
    while len(buffers) < n_episodes:
        batch = next(source)
        for ep in _numpy_episodes(batch):
            if len(buffers) == n_episodes:
                break
            L = len(ep["rew"])
            ends = np.zeros(L, bool)
            # (L + 1, 1): Minari's Arrow storage cannot read back scalar infos
            infos = {key: np.full((L + 1, 1), ep[key], np.int64) for key in
                     ("version_first", "version_last", "worker", "env")}
            buffers.append(EpisodeBuffer(
                id=len(buffers), observations=ep["obs"],
                actions=ep["act"], rewards=ep["rew"].astype(np.float64),
                terminations=np.where(np.arange(L) == L - 1,
                                      ep["terminated"], ends),
                truncations=np.where(np.arange(L) == L - 1,
                                     ep["truncated"], ends),
                infos=infos))
    # rlplay[minari] installs Minari's Arrow storage (Minari's own default,
    # HDF5, needs h5py)
    minari_kwargs.setdefault("data_format", "arrow")
    return minari.create_dataset_from_buffers(
        dataset_id, buffers, env=env, observation_space=observation_space,
        action_space=action_space, **minari_kwargs)


# Minari's dataset ids, ``(namespace/)name-v(version)``, with the version
# (Minari's own pattern leaves it optional, then fails on it) and with no
# segment that leaves the datasets path (``..``, a leading ``/``)
_DATASET_ID = re.compile(r"(?:[-\w]+/)*[-\w]+?-v\d+")


def _check_dataset_id(dataset_id):
    if not isinstance(dataset_id, str):
        raise TypeError(f"dataset_id must be a str, "
                        f"'(namespace/)name-v(version)', got "
                        f"{type(dataset_id).__name__} {dataset_id!r}")
    if not _DATASET_ID.fullmatch(dataset_id):
        raise ValueError(f"dataset_id must be '(namespace/)name-v(version)' "
                         f"(letters, digits, '-' and '_'), e.g. "
                         f"'cartpole/rlplay-v0', got {dataset_id!r}")


def _check_new_dataset(dataset_id):
    # where Minari would write it: inside its datasets path, and new
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path
    try:
        parse_dataset_id(dataset_id)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"dataset_id {dataset_id!r} is not one Minari "
                         f"takes: {exc}") from None
    root = os.path.realpath(get_dataset_path())
    path = os.path.realpath(get_dataset_path(dataset_id))
    if os.path.commonpath([root, path]) != root or path == root:
        raise ValueError(f"dataset_id {dataset_id!r} names a path outside "
                         f"the datasets path {root!r}")
    if os.path.exists(path):
        raise ValueError(f"dataset_id {dataset_id!r}: a dataset of that id "
                         f"exists already, at {path!r} (Minari never "
                         f"overwrites one): pick another name or version")


def _numpy_episodes(batch):
    """The episodes of a batch one by one, as dicts of numpy arrays."""
    off = batch.offsets.tolist()
    meta = {key: getattr(batch.meta, key).tolist()
            for key in ("version_first", "version_last", "worker", "env")}
    for i in range(len(off) - 1):
        a, b = off[i], off[i + 1]
        ep = {"obs": suply(lambda x: x[a + i:b + i + 1].numpy(), batch.obs),
              "act": suply(lambda x: x[a:b].numpy(), batch.act),
              "rew": batch.rew[a:b].numpy(),
              "terminated": bool(batch.terminated[i]),
              "truncated": bool(batch.truncated[i])}
        ep.update({key: value[i] for key, value in meta.items()})
        yield ep
