"""The policy seam: how the core loops call the actor, and where it runs.

- :mod:`.local`: the protocol (:class:`Policy`: ``probe``,
  ``initial_hx``, a step in two phases, ``submit(row, hx)`` then
  ``wait()``, with ``step`` as both, ``lookahead``, ``reset``) and its
  implementation in this process, on the rows themselves
  (:class:`LocalPolicy`, and :class:`FeedForwardPolicy` for a
  feed-forward actor's ``act``);
- :mod:`.device`: the actor on a device of its own, each row moved there
  once (:class:`DevicePolicy`);
- :mod:`.served`: the actor called by an inference server on the shared
  rows themselves, indices on a channel (:class:`ServedPolicy`);
- :mod:`.choose`: which of them an actor gets (:func:`as_policy`).

The core loops (:mod:`rlplay.engine.core`) call nothing else of the
actor; a policy served by another process (:class:`ServedPolicy`) is a
further implementation of :class:`Policy`, not a branch of the loops.
"""
from .choose import as_policy
from .device import DevicePolicy
from .served import ServedPolicy
from .local import (FeedForwardPolicy, LocalPolicy, Policy, copier,
                    feeds_forward, fill_lookahead)

__all__ = ["Policy", "LocalPolicy", "FeedForwardPolicy", "DevicePolicy",
           "ServedPolicy", "as_policy", "fill_lookahead"]

# what the other folders of rlplay import beyond __all__ (the import
# contract, tests/test_imports.py)
__exports__ = ["copier", "feeds_forward"]
