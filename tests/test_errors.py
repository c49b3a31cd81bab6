"""Bad input gets a clear exception: one test per case, through the
same-process generator (and the core loops where that is the only way)."""
import functools
from contextlib import closing

import numpy as np
import pytest
import torch

from envs import (BadKeyEnv, BadRewardEnv, BadShapeEnv, CountingEnv,
                  EmptyVectorEnv, EpisodeInfoEnv, NoAgentsEnv, OldStepEnv,
                  StructuredEnv, failing_factory)
from generators import CountingActor, make
from rlplay.engine import BaseActorModule
from rlplay.engine.core import evaluate, prepare
from rlplay.engine.errors import WorkerError
from rlplay.engine.nested import StructureError
from rlplay.engine.rollout import same, single


class Actor(BaseActorModule):
    """A well-behaved actor for CountingEnv: action 1, hx of shape
    (1, B, 4) (or ``()`` with ``recurrent=False``), info ``{"v": (1, B)}``."""

    def __init__(self, recurrent=True):
        super().__init__()
        self.recurrent = recurrent

    def action(self, fin, virtual):
        return torch.ones(fin.shape, dtype=torch.int64)

    def next_hx(self, hx, n_envs):
        if not self.recurrent:
            return ()
        return torch.zeros(1, n_envs, 4) if hx is None else hx + 1

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return (self.action(fin, virtual), self.next_hx(hx, fin.shape[1]),
                {"v": torch.zeros(fin.shape)})


class StructuredOk(BaseActorModule):
    """A well-behaved actor for StructuredEnv's Tuple action space."""

    def action(self, fin):
        return (torch.zeros(fin.shape, dtype=torch.int64),
                torch.zeros(*fin.shape, 2))

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return self.action(fin), (), {}

    def reset(self, hx, at):
        return ()


def rollout(factory, actor, n_steps=4, n_envs=2, n_batches=2, **kwargs):
    with same.rollout(factory, actor, n_steps, n_envs, **kwargs) as feed:
        for _ in range(n_batches):
            next(feed)


def test_the_fixtures_are_fine():
    rollout(CountingEnv, Actor())
    rollout(StructuredEnv, StructuredOk())


# the factory

def test_factory_not_callable():
    with pytest.raises(TypeError, match="factory must be callable and return "
                                        "a Gymnasium env, got str"):
        rollout("CartPole-v1", Actor())


def test_factory_raises():
    with pytest.raises(RuntimeError, match="factory failed on purpose"):
        rollout(failing_factory, Actor())


def test_factory_returns_a_non_env():
    with pytest.raises(TypeError, match=r"returned dict, which is not a "
                                        r"Gymnasium env \(missing or invalid:"
                                        r" \['reset', 'step', "
                                        r"'observation_space', "
                                        r"'action_space'\]\)"):
        rollout(dict, Actor())


# the actor's action

def test_action_of_the_wrong_structure():
    class TupleAction(Actor):
        def action(self, fin, virtual):
            return (super().action(fin, virtual),) * 2

    with pytest.raises(TypeError, match=r"the actor's action \(second\) "
                                        r"does not match the action space "
                                        r"\(first\): at <root>: leaf of type "
                                        r"Tensor vs tuple of length 2"):
        rollout(CountingEnv, TupleAction())


def test_action_missing_a_tuple_member():
    class OneOfTwo(StructuredOk):
        def action(self, fin):
            return super().action(fin)[:1]

    with pytest.raises(StructureError, match=r"action space \(first\): at "
                                             r"<root>: tuple of length 2 vs "
                                             r"tuple of length 1"):
        rollout(StructuredEnv, OneOfTwo())


def test_action_of_the_wrong_shape():
    class Flat(Actor):
        def action(self, fin, virtual):
            return super().action(fin, virtual)[0]

    with pytest.raises(ValueError, match=r"the actor returned an action of "
                                         r"shape \(3,\), expected \(1, 3\)"):
        rollout(CountingEnv, Flat(), n_envs=3)


def test_action_of_the_wrong_shape_inside_a_tuple():
    class Wide(StructuredOk):
        def action(self, fin):
            a0, a1 = super().action(fin)
            return a0, torch.zeros(*fin.shape, 3)

    with pytest.raises(ValueError, match=r"action of shape \(1, 2, 3\), "
                                         r"expected \(1, 2, 2\)"):
        rollout(StructuredEnv, Wide())


def test_action_of_the_wrong_dtype():
    class Floats(Actor):
        def action(self, fin, virtual):
            return super().action(fin, virtual).float()

    with pytest.raises(TypeError, match=r"the actor returned an action of "
                                        r"dtype torch.float32 for an action "
                                        r"space of dtype torch.int64"):
        rollout(CountingEnv, Floats())


def test_action_not_a_tensor():
    class Numpy(Actor):
        def action(self, fin, virtual):
            return np.ones(fin.shape, np.int64)

    with pytest.raises(TypeError, match="the actor must return actions as "
                                        "tensors, got ndarray"):
        rollout(CountingEnv, Numpy())


def test_wrong_action_only_in_real_steps():
    # prepare() sees a virtual call only; collection checks a real one too
    class Sneaky(Actor):
        def action(self, fin, virtual):
            action = super().action(fin, virtual)
            return action if virtual else action[:, :1]

    with pytest.raises(ValueError, match=r"action of shape \(1, 1\), "
                                         r"expected \(1, 3\)"):
        rollout(CountingEnv, Sneaky(), n_envs=3)


# the actor's hx and info

def test_hx_of_the_wrong_structure_from_step():
    class Pair(Actor):
        def next_hx(self, hx, n_envs):
            if hx is None:
                return torch.zeros(1, n_envs, 4)
            return (hx, hx)

    with pytest.raises(TypeError, match=r"the actor's hx from step\(\) "
                                        r"\(second\) does not match the hx "
                                        r"it was given \(first\): at "
                                        r"<root>: leaf of type Tensor vs "
                                        r"tuple of length 2"):
        rollout(CountingEnv, Pair())


def test_hx_with_a_missing_key_from_step():
    class Keys(Actor):
        def next_hx(self, hx, n_envs):
            if hx is None:
                return {"h": torch.zeros(1, n_envs, 4),
                        "c": torch.zeros(1, n_envs, 4)}
            return {"h": hx["h"]}

    with pytest.raises(StructureError, match=r"hx from step\(\) \(second\) "
                                             r"does not match the hx it was "
                                             r"given \(first\): at <root>: "
                                             r".*missing keys \['c'\]"):
        rollout(CountingEnv, Keys())


def test_hx_of_the_wrong_shape_from_step():
    class Grows(Actor):
        def next_hx(self, hx, n_envs):
            if hx is None:
                return torch.zeros(1, n_envs, 4)
            return torch.zeros(1, n_envs, 5)

    with pytest.raises(ValueError, match=r"the actor's hx from step\(\) holds "
                                         r"\(1, 2, 5\) torch.float32, but the "
                                         r"hx it was given holds \(1, 2, 4\) "
                                         r"torch.float32"):
        rollout(CountingEnv, Grows())


def test_hx_that_reset_changes():
    class BadReset(Actor):
        def reset(self, hx, at):
            return hx[0]

    with pytest.raises(ValueError, match=r"hx from step\(\) holds \(1, 2, "
                                         r"4\) torch.float32, but the hx that "
                                         r"reset\(\) makes of it holds \(2, "
                                         r"4\) torch.float32"):
        rollout(CountingEnv, BadReset())


def test_info_not_tensors():
    class Floats(Actor):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            act, hx, _ = super().step(stepno, obs, act, rew, fin, hx=hx,
                                      virtual=virtual)
            return act, hx, {"v": 1.0}

    with pytest.raises(ValueError, match=r"the actor's info must hold "
                                         r"tensors of shape \(1, "
                                         r"n_envs=2, \.\.\.\), got float"):
        rollout(CountingEnv, Floats())


def test_info_of_the_wrong_shape():
    class Flat(Actor):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            act, hx, _ = super().step(stepno, obs, act, rew, fin, hx=hx,
                                      virtual=virtual)
            return act, hx, {"v": torch.zeros(fin.shape[1])}

    with pytest.raises(ValueError, match=r"got \(2,\)"):
        rollout(CountingEnv, Flat())


# the env's observations

def test_observation_of_the_wrong_shape_at_reset():
    with pytest.raises(ValueError, match=r"env 0 reset\(\): the observation "
                                         r"has shape \(2,\), its space says "
                                         r"\(1,\)"):
        rollout(functools.partial(BadShapeEnv, at=0), Actor())


def test_observation_of_the_wrong_shape_mid_episode():
    made = []

    def factory():  # only the second env misbehaves, at its third step
        made.append(None)
        return BadShapeEnv(at=3 if len(made) == 2 else -1)

    with pytest.raises(ValueError, match=r"env 1 step\(\): the observation "
                                         r"has shape \(2,\), its space says "
                                         r"\(1,\)"):
        rollout(factory, Actor())


def test_final_observation_of_the_wrong_shape():
    # the observation that ends an episode goes to `final`, checked too
    with pytest.raises(ValueError, match=r"env 0 step\(\): the observation "
                                         r"has shape \(2,\)"):
        rollout(functools.partial(BadShapeEnv, at=2, term_every=2), Actor())


def test_observation_with_a_wrong_key_at_reset():
    with pytest.raises(StructureError, match=r"env 0 reset\(\): the "
                                             r"observation does not match "
                                             r"the observation space: at "
                                             r"<root>: dict with keys "
                                             r"\['flag', 'pair', 'pos'\] vs "
                                             r"dict with keys \['pos', "
                                             r"'pair', 'speed'\] \(missing "
                                             r"keys \['flag'\]; extra keys "
                                             r"\['speed'\]\)"):
        rollout(functools.partial(BadKeyEnv, at=0), StructuredOk())


def test_observation_with_an_extra_key_mid_episode():
    with pytest.raises(StructureError, match=r"env 0 step\(\): the "
                                             r"observation does not match "
                                             r"the observation space: .*"
                                             r"extra keys \['speed'\]"):
        rollout(functools.partial(BadKeyEnv, at=2, extra=True),
                StructuredOk())


def test_observation_of_the_wrong_shape_inside_a_dict():
    class Wide(StructuredEnv):
        def _obs(self):
            obs = super()._obs()
            obs["pos"] = np.zeros(3, np.float32)
            return obs

    with pytest.raises(ValueError, match=r"env 0 reset\(\): the observation "
                                         r"has shape \(3,\), its space says "
                                         r"\(2,\)"):
        rollout(Wide, StructuredOk())


def test_observation_container_where_the_space_has_a_leaf():
    class Boxed(StructuredEnv):
        def _obs(self):
            obs = super()._obs()
            obs["flag"] = {"value": obs["flag"]}
            return obs

    with pytest.raises(TypeError, match=r"at \['flag'\]: leaf of type "
                                        r"ndarray vs dict with keys "
                                        r"\['value'\]"):
        rollout(Boxed, StructuredOk())


# the env's API and info

def test_step_with_the_old_gym_api():
    with pytest.raises(TypeError, match=r"OldStepEnv.step\(\) must return "
                                        r"\(obs, reward, terminated, "
                                        r"truncated, info\) as in Gymnasium "
                                        r"1.x, got tuple of length 4"):
        rollout(OldStepEnv, Actor())


@pytest.mark.parametrize("reward, shown", [
    ("1.0", "str '1.0'"), (None, "NoneType None"),
    (np.ones(2), r"ndarray array\(\[1., 1.\]\)")])
def test_a_reward_that_is_not_a_number(reward, shown):
    """In collection and in evaluation, naming the env column and step."""
    factory = functools.partial(BadRewardEnv, reward, at=3)
    match = rf"env 0 step 2: the reward must be a real number, got {shown}"
    with pytest.raises(TypeError, match=match):
        rollout(factory, Actor(), n_envs=1)
    with pytest.raises(TypeError, match=match):
        evaluate([factory()], Actor(), 1)


def test_a_nan_reward_is_refused_where_spaces_are_checked():
    """In collection and in evaluation, naming the env column and step; a
    worker's is a WorkerError with that message, not restarted."""
    factory = functools.partial(BadRewardEnv, float("nan"), at=3,
                                term_every=5)
    match = r"env 0 step 2: the reward is NaN"
    with pytest.raises(ValueError, match=match):
        rollout(factory, Actor(), n_envs=1)
    with pytest.raises(ValueError, match=match):
        rollout(factory, Actor(), n_envs=1, check_spaces="always")
    with pytest.raises(ValueError, match=match):
        evaluate([factory()], Actor(), 1)
    with pytest.raises(ValueError, match="env 1 step 2: the reward is NaN"):
        evaluate([CountingEnv(term_every=5), factory()], Actor(), 2)
    # the check is the space checks': off with them
    rollout(factory, Actor(), n_envs=1, check_spaces="never")
    evaluate([factory()], Actor(), 1, check_spaces="never")
    with closing(single.rollout(factory, Actor(), 4, 1, start_method="fork",
                                restarts=1)) as feed:
        with pytest.raises(WorkerError, match=match) as info:
            next(feed)
            next(feed)
        assert info.value.type_name == "builtins.ValueError"
        assert feed.stats["restarts"] == 0


def test_rewards_of_numpy_types_are_numbers():
    for reward in (np.float32(0.5), np.int64(2), np.array(0.5),
                   np.array([0.5]), True):
        rollout(functools.partial(BadRewardEnv, reward, at=1), Actor())


def test_env_info_not_matching_its_spec():
    with pytest.raises(TypeError, match=r"env info \['done'\] does not "
                                        r"match its spec: at <root>: dict "
                                        r"with keys \['flag'\] vs leaf of "
                                        r"type float"):
        rollout(functools.partial(CountingEnv, term_every=2), Actor(),
                env_info={"done": {"flag": 0.0}})


def test_env_info_missing_a_nested_key():
    with pytest.raises(StructureError, match=r"env info \['episode'\] does "
                                             r"not match its spec: at "
                                             r"<root>: .*missing keys "
                                             r"\['t'\]"):
        rollout(functools.partial(EpisodeInfoEnv, term_every=2), Actor(),
                env_info={"episode": {"r": 0.0, "l": 0, "t": 0.0}})


# counts

@pytest.mark.parametrize("n_steps", [0, -3])
def test_n_steps_below_one(n_steps):
    with pytest.raises(ValueError, match=f"n_steps must be at least 1, got "
                                         f"{n_steps}"):
        rollout(CountingEnv, Actor(), n_steps=n_steps)


@pytest.mark.parametrize("n_envs", [0, -1])
def test_n_envs_below_one(n_envs):
    with pytest.raises(ValueError, match=f"n_envs must be at least 1, got "
                                         f"{n_envs}"):
        rollout(CountingEnv, Actor(), n_envs=n_envs)


@pytest.mark.parametrize("name, value, type_name", [
    ("n_steps", 2.0, "float"), ("n_steps", "4", "str"),
    ("n_envs", 2.5, "float"), ("n_envs", True, "bool"),
    ("n_envs", None, "NoneType")])
def test_counts_must_be_ints(name, value, type_name):
    made = []

    def factory():
        made.append(None)
        return CountingEnv()

    with pytest.raises(TypeError, match=f"{name} must be an int, got "
                                        f"{type_name}"):
        rollout(factory, Actor(), **{name: value})
    assert made == []  # checked before any env is made


@pytest.mark.parametrize("kind", ["same", "single", "multi", "evaluator"])
@pytest.mark.parametrize("factory, what", [
    (NoAgentsEnv, r"a PettingZoo env with no agents \(possible_agents "
                  r"\[\]\)"),
    (EmptyVectorEnv, r"a source of no envs \(EmptyVectorEnv with "
                     r"num_envs=0\)")], ids=["no-agents", "no-envs"])
def test_a_source_of_no_columns_is_refused_up_front(kind, factory, what):
    """No count of such sources adds up: refused where sources are sized
    (in the learner, before a worker starts), never a factory called
    forever, a division by zero or a worker that waits out its time."""
    if factory is NoAgentsEnv:
        pytest.importorskip("pettingzoo")
    name = "n_per_actor" if kind == "multi" else "n_envs"
    made = []

    def counted():
        made.append(None)
        return factory()

    with pytest.raises(ValueError, match=f"factory .* made {what}: {name}=2 "
                       f"columns need sources of at least one column each"):
        with closing(make(kind, counted, CountingActor(), 4, 2,
                          n_actors=1)) as feed:
            next(iter(feed))
    assert made == [None]


def test_prepare_checks_counts():
    with pytest.raises(ValueError, match="n_steps must be at least 1"):
        prepare(CountingEnv(), Actor(), 0, 1)


def test_evaluate_checks_n_episodes():
    with pytest.raises(ValueError, match="n_episodes must be at least 1, "
                                         "got 0"):
        evaluate([CountingEnv()], Actor(), 0)
    with pytest.raises(TypeError, match="n_episodes must be an int, got "
                                        "float"):
        evaluate([CountingEnv()], Actor(), 2.5)
    with pytest.raises(ValueError, match="n_envs must be at least 1, got 0"):
        evaluate([], Actor(), 1)


def test_actor_info_changing_keys_mid_run_names_them():
    from contextlib import closing

    from envs import counting_factory

    class Shifty(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            key = "v" if virtual else "w"
            return (torch.zeros(obs.shape[:2], dtype=torch.long), (),
                    {key: torch.zeros(obs.shape[:2])})

    with closing(same.rollout(counting_factory, Shifty(), 4, 2)) as feed:
        with pytest.raises(StructureError, match=r"info.*'w'.*'v'|info.*'v'.*'w'"):
            next(feed)


# core.evaluate checks the actor as collection does

@pytest.mark.parametrize("action, error, message", [
    (lambda fin: torch.full(fin.shape, 2.7), TypeError,
     r"the actor returned an action of dtype torch.float32 for an action "
     r"space of dtype torch.int64"),
    (lambda fin: torch.ones(1, 1, dtype=torch.int64), ValueError,
     r"the actor returned an action of shape \(1, 1\), expected \(1, 3\)"),
    (lambda fin: torch.ones(*fin.shape, 2, dtype=torch.int64), ValueError,
     r"the actor returned an action of shape \(1, 3, 2\), expected "
     r"\(1, 3\)"),
], ids=["float", "broadcast", "extra-dim"])
def test_evaluate_checks_the_actors_actions(action, error, message):
    class Wrong(Actor):
        def action(self, fin, virtual):
            # right in the virtual probe, wrong in real steps
            return super().action(fin, virtual) if virtual else action(fin)

    envs = [CountingEnv(term_every=2) for _ in range(3)]
    with pytest.raises(error, match=message):
        evaluate(envs, Wrong(), 3)
    assert [env.t for env in envs] == [0, 0, 0]  # before any env step


def test_evaluate_checks_hx_and_info():
    class Grows(Actor):
        def next_hx(self, hx, n_envs):
            return torch.zeros(1, n_envs, 4) if hx is None else \
                torch.zeros(1, n_envs, 5)

    with pytest.raises(ValueError, match=r"the actor's hx from step\(\) "
                                         r"holds \(1, 2, 5\)"):
        evaluate([CountingEnv(term_every=2), CountingEnv(term_every=2)],
                 Grows(), 2)


@pytest.mark.parametrize("value, error, message", [
    (0, ValueError, "max_steps must be at least 1, got 0"),
    (-5, ValueError, "max_steps must be at least 1, got -5"),
    (2.5, TypeError, "max_steps must be an int, got float 2.5"),
    ("x", TypeError, "max_steps must be an int, got str 'x'"),
    (True, TypeError, "max_steps must be an int, got bool True"),
])
def test_evaluate_checks_max_steps(value, error, message):
    env = CountingEnv()
    with pytest.raises(error, match=f"^{message}$"):
        evaluate([env], Actor(), 1, max_steps=value)
    assert env.n_episodes == -1  # checked before any reset


def test_evaluate_max_steps_one_and_none():
    returns, lengths = evaluate([CountingEnv()], Actor(), 2, max_steps=1)
    assert lengths.tolist() == [1, 1] and returns.tolist() == [1.0, 1.0]
    _, lengths = evaluate([CountingEnv(term_every=3)], Actor(), 1,
                          max_steps=None)
    assert lengths.tolist() == [3]


# not an actor at all

@pytest.mark.parametrize("actor, name", [(None, "NoneType"),
                                         (object(), "object"),
                                         (torch.nn.Linear(1, 1), "Linear")])
def test_core_loops_reject_a_non_actor_up_front(actor, name):
    from rlplay.engine.core import startup

    # a module without the actor API is told about the adapter
    hint = r": a plain policy .* PolicyActor\(Linear\(\.\.\.\)\)" \
        if name == "Linear" else ""
    message = (r"^actor must be a torch.nn.Module with the actor API "
               r"step\(...\)/reset\(...\) \(see BaseActorModule\), got "
               + name + hint + "$")
    env = CountingEnv()
    with pytest.raises(TypeError, match=message):
        prepare(env, actor, 2, 1)
    buffer = prepare(env, Actor(), 2, 1)
    with pytest.raises(TypeError, match=message):
        startup([env], actor, buffer)
    with pytest.raises(TypeError, match=message):
        evaluate([env], actor, 1)
    assert env.n_episodes == -1  # no env was reset
