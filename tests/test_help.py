"""What a newcomer reads first: the signatures and ``help()`` of the
generators, and the messages of the usual first mistakes (a plain module
as the actor, an env or an env id as the factory, a policy of the wrong
input size, a pool too large for ``/dev/shm``)."""
import functools
import inspect
import pydoc
import typing

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from envs import SpacesEnv
from rlplay.engine import BaseActorModule, PolicyActor, pool
from rlplay.engine.errors import CapacityError
from rlplay.engine.rollout import (Keywords, PoolKeywords, WorkerKeywords,
                                   cluster, multi, same, single)
from rlplay.engine.workers import _batch

CARTPOLE = functools.partial(gymnasium.make, "CartPole-v1")
# help(multi.rollout) was 185 lines, most of them the methods of private
# classes; its documentation alone is about 90
HELP_LINES = 110
GENERATORS = {"same": (same, Keywords), "single": (single, WorkerKeywords),
              "multi": (multi, PoolKeywords),
              "cluster": (cluster, PoolKeywords)}


@pytest.mark.parametrize("name", list(GENERATORS))
def test_the_signature_lists_every_keyword(name):
    module, keywords = GENERATORS[name]
    parameters = inspect.signature(module.rollout).parameters
    assert set(typing.get_type_hints(keywords)) <= set(parameters)
    for key in ("entropy", "copy", "check_spaces", "resume"):
        assert parameters[key].kind is inspect.Parameter.KEYWORD_ONLY
    if name != "same":
        for key in ("timeout", "restarts", "restart_delay"):
            assert key in parameters
    if name in ("multi", "cluster"):
        assert parameters["max_lag"].default is None
    assert parameters["copy"].default is True
    # and what static tools read: **kwargs of one TypedDict (PEP 692)
    annotation = inspect.signature(
        module.rollout, follow_wrapped=False).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in annotation.values())
    assert module.rollout.__annotations__["kwargs"].__args__ == (keywords,)


@pytest.mark.parametrize("name", list(GENERATORS))
def test_help_is_short_and_shows_no_private_class(name):
    module, _ = GENERATORS[name]
    text = pydoc.render_doc(module.rollout, renderer=pydoc.plaintext)
    assert len(text.splitlines()) < HELP_LINES
    for private in ("Gathered", "Supervised", "Breakable", "_base",
                    "_gather", "Method resolution order"):
        assert private not in text
    words = " ".join(text.split())
    assert "they are defined once too" not in words  # the garbled sentence
    assert "documented once, in rlplay.engine.rollout" in words.replace(
        ":mod:`", "").replace("`", "")


def test_a_plain_module_as_the_actor_is_told_about_policy_actor():
    with pytest.raises(TypeError, match=r"got Linear: a plain policy .* "
                                        r"PolicyActor\(Linear\(\.\.\.\)\)"):
        same.rollout(CARTPOLE, nn.Linear(4, 2), 4, 2)


@pytest.mark.parametrize("factory", ["env", "id"])
def test_an_env_or_an_id_as_the_factory_is_told_what_to_pass(factory):
    given = gymnasium.make("CartPole-v1") if factory == "env" \
        else "CartPole-v1"
    with pytest.raises(TypeError, match=r"factory must be callable.*"
                       r"functools.partial\(gymnasium.make, "
                       r"'CartPole-v1'\)"):
        same.rollout(given, PolicyActor(nn.Linear(4, 2)), 4, 2)


def test_a_policy_of_the_wrong_input_size_is_told_it_was_probed():
    with pytest.raises(RuntimeError) as info:
        same.rollout(CARTPOLE, PolicyActor(nn.Linear(3, 2)), 4, 2)
    text = "".join(getattr(info.value, "__notes__", [])) + str(info.value)
    assert "cannot be multiplied" in text  # torch's own message, kept
    assert "probed the actor PolicyActor" in text
    assert "(1, 2, 4) torch.float32" in text


def test_multi_checks_dev_shm_before_allocating_the_learners_batch(
        monkeypatch):
    """A pool too large for /dev/shm: CapacityError before the learner's
    batch is allocated (it zero-filled gigabytes first), naming
    final=False where the final observations weigh."""
    def allocated(*args, **kwargs):
        raise AssertionError("the learner's batch was allocated")

    monkeypatch.setattr(_batch.Collation, "__init__", allocated)
    monkeypatch.setattr(pool, "shm_free_bytes", lambda path=None: 2 ** 20)
    frames = functools.partial(
        SpacesEnv, spaces.Box(0, 255, (4, 84, 84), np.uint8),
        spaces.Discrete(2), lambda episode, t: np.zeros((4, 84, 84),
                                                        np.uint8))
    with pytest.raises(CapacityError, match=r"/dev/shm.*final=False"):
        multi.rollout(frames, Zero(), 64, 2, 4, 4, 2, start_method="fork")
    with pytest.raises(CapacityError, match=r"/dev/shm.*docker run "
                                            r"--shm-size=\.\.\.\)$"):
        # no hint where the final observations weigh little
        multi.rollout(CARTPOLE, PolicyActor(nn.Linear(4, 2)), 4096, 2, 4,
                      4, 2, start_method="fork")


class Zero(BaseActorModule):
    """Action 0 everywhere."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return torch.zeros(fin.shape, dtype=torch.int64), (), {}

    def reset(self, hx, at):
        return ()


def test_the_stats_are_what_their_table_says():
    """Every key of STATS_KEYS is in the table of rlplay.engine.rollout;
    21 batches without training end at version 20 (next() calls, not
    updates), the times are cumulative and steps_per_s_collect is steps
    per (summed) collecting second."""
    import rlplay.engine.rollout as package
    from rlplay.engine.rollout import STATS_KEYS

    table = package.__doc__[package.__doc__.index("key    "):]
    for key in STATS_KEYS:
        assert f"``{key}``" in table, key
    collected = []
    with same.rollout(CARTPOLE, PolicyActor(nn.Linear(4, 2)), 4, 2,
                      entropy=0) as feed:
        for _ in range(21):
            batch = next(feed)
            collected.append(feed.stats["time_collect"])
    stats = feed.stats
    assert stats["version"] == 20 and int(batch.meta.version[0]) == 20
    assert collected == sorted(collected) and collected[0] > 0
    assert stats["steps"] == 21 * 4 * 2
    assert stats["steps_per_s_collect"] == stats["steps"] / stats[
        "time_collect"]
