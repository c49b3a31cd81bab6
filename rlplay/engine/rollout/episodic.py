"""Whole episodes over any generator, at their 0.1.0 path: the consumer
lives in :mod:`rlplay.engine.consumers.episodic` (its full description;
this module re-exports it), and :func:`rollout`, whole episodes collected
in this process, here, beside the generator it drives (``same``).
"""
from ..consumers import (MAX_LENGTH, EpisodeMeta, Episodes, Episodic,
                         PaddedEpisodes, check_state, episodes, record)
from ..core import check_count
from . import same

__all__ = ["Episodes", "EpisodeMeta", "PaddedEpisodes", "Episodic",
           "episodes", "rollout", "record"]


def rollout(factory, actor, n_envs, n_episodes, *, n_steps=32,
            max_length=MAX_LENGTH, **kwargs):
    """Whole episodes collected in this process: :func:`episodes` over
    ``same.rollout(factory, actor, n_steps, n_envs, **kwargs)``, with the
    actor's ``hx`` at each episode's start. ``close()`` closes both.
    ``resume=`` takes an :meth:`Episodic.state_dict` of such a rollout."""
    check_count("n_episodes", n_episodes)
    check_count("max_length", max_length)
    resume = kwargs.pop("resume", None)
    if resume is not None:
        check_state(resume, "resume")
    feed = same.rollout(factory, actor, n_steps, n_envs, **kwargs,
                        resume=None if resume is None else resume["feed"])
    episodic = Episodic(feed, n_episodes, max_length=max_length,
                        actor=actor)
    if resume is not None:
        episodic.load_state_dict(resume)
    return episodic
