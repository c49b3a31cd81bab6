"""Core loops and the layout of a fragment: the only code that calls the
actor (through one policy interface, :mod:`rlplay.engine.policy`), and
that steps envs (through the env adapter's
:class:`~rlplay.engine.envs.EnvBatch`, the only code that calls
``env.step``).

- :mod:`.layout`: the layout of a fragment, documented there in full (its
  table of fields, rows and time indices, sticky frozen rows, lost calls,
  space checks, clipped actions): the types (:class:`State`,
  :class:`Fragment`, :class:`Meta`, :class:`EpisodeStats`), the env axis
  of each field (:func:`env_axes`), selecting env columns
  (:func:`columns`), which rows an executed action led to (:func:`acted`,
  which :func:`episode_stats` and the masks of :mod:`rlplay.engine.returns`
  follow), where episodes start and end (:func:`episode_edges`), and the
  validators of the arguments that size a fragment;
- the policy seam, through which both loops call the actor, is
  :mod:`rlplay.engine.policy` (:class:`LocalPolicy`, :class:`DevicePolicy`,
  :func:`as_policy`, re-exported here);
- :mod:`.accounting`: one episode accounting for both loops
  (:class:`Accounts`: running returns, lengths, step counts, lost calls;
  :class:`~.accounting.TorchAccounts`, the episode loop's on a torch
  source's device);
- :mod:`.checks`: the space checks (``check_spaces``);
- :mod:`.fragments`: the fragment loop: :func:`prepare` allocates a
  fragment buffer, :func:`startup` resets the envs and returns the
  :class:`Context` of an ongoing collection (:mod:`.context`),
  :func:`collect` fills a buffer with the next fragment in place;
- :mod:`.torch_loop`: the fragment loop of torch-native sources (the
  same layout, written with torch operations where the source lives),
  which :func:`startup` and :func:`collect` choose by the env batch's
  kind (:class:`TorchContext`);
- :mod:`.episodes`: the episode loop: :func:`evaluate` plays whole
  episodes, :func:`episode` one; :mod:`.torch_episodes`, the episode
  loop of torch-native sources, which :func:`evaluate` chooses by the
  env batch's kind.

Every generator in :mod:`rlplay.engine.rollout` is a thin driver around
these loops.
"""
from .accounting import Accounts
from .context import Context
from .episodes import episode, evaluate
from .finals import copy_obs_to_final, fill_final, obs_is_final
from .fragments import collect, fragment_device, prepare, startup
from .layout import (CHECK_SPACES, EpisodeEdges, EpisodeStats, Fragment,
                     Meta, State, acted, check_count, check_flag,
                     check_spaces_mode,
                     check_sticky, columns, env_axes, episode_edges,
                     episode_stats, terminated)
from ..devices import module_device
from ..policy import DevicePolicy, LocalPolicy, as_policy
from .torch_loop import TorchContext

__all__ = [
    "check_count",
    "check_flag",
    "check_spaces_mode",
    "check_sticky",
    "State",
    "Fragment",
    "EpisodeStats",
    "Meta",
    "env_axes",
    "columns",
    "acted",
    "EpisodeEdges",
    "episode_edges",
    "Context",
    "prepare",
    "startup",
    "collect",
    "evaluate",
    "episode",
    "episode_stats",
    "CHECK_SPACES",
    "LocalPolicy",
    "DevicePolicy",
    "as_policy",
    "module_device",
    "fragment_device",
    "TorchContext",
    "Accounts",
]

# what the other folders of rlplay import beyond __all__ (the import
# contract, tests/test_imports.py): the copies of final (the learner's
# collation) and the episode-end mask of the returns
__exports__ = ["copy_obs_to_final", "obs_is_final", "fill_final",
               "terminated"]
