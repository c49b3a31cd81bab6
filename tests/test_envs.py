"""The Gymnasium adapter: spaces, the factory, reset/step checks."""
import functools

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from envs import CountingEnv, SpacesEnv, StructuredEnv
from rlplay.engine import envs as E
from rlplay.engine import seeds as S


# spaces

def test_space_example_leaf_spaces():
    box = E.space_example(spaces.Box(-1, 1, (3, 2), np.float32))
    assert box.shape == (3, 2) and box.dtype == np.float32 and not box.any()
    box = E.space_example(spaces.Box(0, 255, (4,), np.uint8))
    assert box.dtype == np.uint8
    discrete = E.space_example(spaces.Discrete(7))
    assert discrete.shape == () and discrete.dtype == np.int64
    multi = E.space_example(spaces.MultiDiscrete([3, 4, 5]))
    assert multi.shape == (3,) and multi.dtype == np.int64
    multi = E.space_example(spaces.MultiDiscrete([[2, 3], [4, 5]]))
    assert multi.shape == (2, 2)
    binary = E.space_example(spaces.MultiBinary(5))
    assert binary.shape == (5,) and binary.dtype == np.int8
    binary = E.space_example(spaces.MultiBinary([2, 3]))
    assert binary.shape == (2, 3)


def test_space_example_dict_and_tuple_nestings():
    space = spaces.Dict({
        "pos": spaces.Box(-1, 1, (2,), np.float32),
        "inner": spaces.Tuple((spaces.Discrete(3), spaces.Dict({
            "bits": spaces.MultiBinary(4),
            "dice": spaces.MultiDiscrete([6, 6])}))),
    })
    example = E.space_example(space)
    assert type(example) is dict and type(example["inner"]) is tuple
    # gymnasium.spaces.Dict sorts its keys; the example follows the space
    assert list(example) == list(space.spaces) == ["inner", "pos"]
    assert example["pos"].shape == (2,)
    assert example["inner"][0].shape == () and \
        example["inner"][0].dtype == np.int64
    assert example["inner"][1]["bits"].shape == (4,)
    assert example["inner"][1]["dice"].shape == (2,)
    sample = space.sample()
    assert sample["inner"][1]["dice"].shape == \
        example["inner"][1]["dice"].shape


@pytest.mark.parametrize("space", [
    spaces.Text(5),
    spaces.Sequence(spaces.Discrete(2)),
    spaces.Graph(node_space=spaces.Discrete(2), edge_space=None),
    spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Text(3)}),
    spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(2)))),
], ids=["text", "sequence", "graph", "in-dict", "in-tuple"])
def test_unsupported_space(space):
    with pytest.raises(TypeError, match=r"unsupported space .*: rlplay "
                                        r"handles Box, Discrete, "
                                        r"MultiDiscrete, MultiBinary, Dict "
                                        r"and Tuple"):
        E.space_example(space)


# make_envs

def test_make_envs_builds_and_seeds_spaces():
    envs = E.make_envs(CountingEnv, S.env_seed_sequences(0, 3))
    assert len(envs) == 3 and all(isinstance(e, CountingEnv) for e in envs)
    samples = [[int(e.action_space.sample()) for _ in range(20)]
               for e in envs]
    again = E.make_envs(CountingEnv, S.env_seed_sequences(0, 3))
    assert samples == [[int(e.action_space.sample()) for _ in range(20)]
                       for e in again]
    assert len({tuple(s) for s in samples}) == 3  # per env distinct
    other = E.make_envs(CountingEnv, S.env_seed_sequences(1, 3))
    assert samples != [[int(e.action_space.sample()) for _ in range(20)]
                       for e in other]


def test_make_envs_seeds_observation_space_sampling():
    def sample(entropy):
        envs = E.make_envs(StructuredEnv, S.env_seed_sequences(entropy, 2))
        return [[e.observation_space.sample()["pos"].tolist()
                 for _ in range(5)] for e in envs]

    first = sample(11)
    assert first == sample(11) and first[0] != first[1]


def test_factory_with_seed_parameter_receives_its_seed():
    received = []

    def factory(seed):
        received.append(seed)
        return CountingEnv()

    seqs = S.env_seed_sequences(9, 3)
    E.make_envs(factory, seqs)
    assert received == [int(ss.generate_state(1)[0]) for ss in seqs]
    assert all(isinstance(s, int) for s in received)
    assert len(set(received)) == 3

    received.clear()

    def keyword_only(*, seed=None, term_every=2):
        received.append(seed)
        return CountingEnv(term_every=term_every)

    E.make_envs(keyword_only, seqs[:1])
    assert received == [int(seqs[0].generate_state(1)[0])]


def test_factory_without_explicit_seed_gets_none():
    calls = []

    def kwargs_factory(**kwargs):
        calls.append(kwargs)
        return CountingEnv()

    E.make_envs(kwargs_factory, S.env_seed_sequences(0, 2))
    assert calls == [{}, {}]
    # gymnasium.make takes **kwargs: it must not get seed= (CartPole's
    # constructor has no such parameter)
    envs = E.make_envs(functools.partial(gymnasium.make, "CartPole-v1"),
                       S.env_seed_sequences(0, 2))
    assert envs[0].observation_space.shape == (4,)
    for env in envs:
        env.close()


class Closable(CountingEnv):
    closed = []

    def close(self):
        Closable.closed.append(self)


def test_factory_not_callable():
    with pytest.raises(TypeError, match="factory must be callable and "
                                        "return a Gymnasium env, got str"):
        E.make_envs("CartPole-v1", S.env_seed_sequences(0, 1))


def test_factory_raises_and_earlier_envs_are_closed():
    Closable.closed.clear()
    made = []

    def factory():
        if len(made) == 2:
            raise RuntimeError("third env failed")
        made.append(Closable())
        return made[-1]

    with pytest.raises(RuntimeError, match="third env failed"):
        E.make_envs(factory, S.env_seed_sequences(0, 4))
    assert Closable.closed == made


@pytest.mark.parametrize("thing", [object(), None, 3,
                                   gymnasium.spaces.Discrete(2)])
def test_factory_returns_something_that_is_not_an_env(thing):
    with pytest.raises(TypeError, match=r"returned \w+, which is not a "
                                        r"Gymnasium env \(missing or "
                                        r"invalid: \["):
        E.make_envs(lambda: thing, S.env_seed_sequences(0, 2))


def test_factory_returns_an_env_with_invalid_spaces():
    class NoSpaces(CountingEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = (1, 2)

    with pytest.raises(TypeError, match=r"returned NoSpaces, which is not a "
                                        r"Gymnasium env \(missing or "
                                        r"invalid: spaces\)"):
        E.make_envs(NoSpaces, S.env_seed_sequences(0, 1))


# reset and step

def test_reset_checks_the_gymnasium_api():
    env = CountingEnv()
    obs, info = E.reset(env, seed=3)
    assert obs.shape == (1,) and info == {}

    class OldReset(CountingEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed)[0]

    with pytest.raises(TypeError, match=r"OldReset.reset\(\) must return "
                                        r"\(obs, info\) as in Gymnasium "
                                        r"1.x, got ndarray"):
        E.reset(OldReset())


def test_reset_seed_is_reproducible():
    a, b = CountingEnv(), CountingEnv()
    assert E.reset(a, seed=5)[0] == E.reset(b, seed=5)[0]
    assert E.reset(a, seed=6)[0] != E.reset(b, seed=5)[0]


def test_check_step():
    env = CountingEnv()
    result = (np.zeros(1), 0.0, False, False, {})
    assert E.check_step(env, result) is result
    with pytest.raises(TypeError, match=r"CountingEnv.step\(\) must return "
                                        r"\(obs, reward, terminated, "
                                        r"truncated, info\) as in Gymnasium "
                                        r"1.x, got tuple of length 4"):
        E.check_step(env, result[:4])
    with pytest.raises(TypeError, match=r"got list of length \?$"):
        E.check_step(env, list(result))


# env info spec

def test_info_example():
    spec = E.info_example({"flag": True, "count": 3, "score": 1.5,
                           "vec": np.zeros(3, np.float64),
                           "episode": {"r": 0.0, "l": 0}})
    assert spec["flag"].dtype == bool and spec["count"].dtype == np.int64
    assert spec["score"].dtype == np.float32 and spec["score"].shape == ()
    assert spec["vec"].shape == (3,) and spec["vec"].dtype == np.float64
    assert spec["episode"]["l"].dtype == np.int64
    assert E.info_example(None) == {}


def test_info_example_rejects_bad_specs():
    with pytest.raises(TypeError, match="env info spec must be a dict of "
                                        "example values, got list"):
        E.info_example(["t"])
    with pytest.raises(TypeError, match="env info values must be numeric, "
                                        "got <U3"):
        E.info_example({"name": "abc"})


def test_close_envs_tries_every_env_and_reraises_the_first_error():
    closed = []

    class Failing(CountingEnv):
        def __init__(self, name, fail):
            super().__init__()
            self.name, self.fail = name, fail

        def close(self):
            closed.append(self.name)
            if self.fail:
                raise OSError(f"{self.name} would not close")

    envs = [Failing("a", False), Failing("b", True), Failing("c", True)]
    with pytest.raises(OSError, match="b would not close"):
        E.close_envs(envs)
    assert closed == ["a", "b", "c"]
    E.close_envs([])


# placeholders: a valid element of a space, nearest zero

def test_space_placeholder_leaf_spaces():
    def check(space, expected):
        value = E.space_placeholder(space)
        example = E.space_example(space)
        assert value.shape == example.shape and value.dtype == example.dtype
        assert value.tolist() == expected
        assert space.contains(value), (space, value)

    check(spaces.Discrete(5), 0)
    check(spaces.Discrete(3, start=1), 1)
    check(spaces.Discrete(3, start=-1), 0)   # zero where zero is valid
    check(spaces.Discrete(2, start=-5), -4)  # else the nearest bound
    check(spaces.Box(-1.0, 1.0, (2,), np.float32), [0.0, 0.0])
    check(spaces.Box(1.0, 2.0, (2,), np.float32), [1.0, 1.0])
    check(spaces.Box(-np.inf, -3.0, (1,), np.float32), [-3.0])
    check(spaces.Box(np.float32([-np.inf, 2, -1]),
                     np.float32([np.inf, 3, 1])), [0.0, 2.0, 0.0])
    check(spaces.Box(5, 9, (2, 2), np.uint8), [[5, 5], [5, 5]])
    check(spaces.MultiDiscrete([3, 4], start=[1, -2]), [1, 0])
    check(spaces.MultiBinary(3), [0, 0, 0])


def test_space_placeholder_nestings():
    space = spaces.Dict({
        "a": spaces.Tuple((spaces.Discrete(3, start=1),
                           spaces.Box(1.0, 2.0, (1,), np.float32))),
        "b": spaces.MultiBinary(2)})
    value = E.space_placeholder(space)
    assert type(value) is dict and type(value["a"]) is tuple
    assert value["a"][0] == 1 and value["a"][1].tolist() == [1.0]
    assert space.contains(value)


def test_space_placeholder_rejects_unsupported_spaces():
    with pytest.raises(TypeError, match="unsupported space"):
        E.space_placeholder(spaces.Tuple((spaces.Discrete(2),
                                          spaces.Text(2))))


# what a step of an env batch reports

def _row_out(n, obs_example, t=0, final=True):
    """A RowOut of ``n`` columns for single-array observations."""
    obs = np.zeros((n, *obs_example.shape), obs_example.dtype)
    return E.RowOut(t=t, obs=obs, rew=np.zeros(n, np.float64),
                    fin=np.zeros(n, bool), truncated=np.zeros(n, bool),
                    final=np.zeros_like(obs) if final else None, info={},
                    info_mask={})


def test_a_step_reports_ended_columns_and_the_rewards_as_given():
    batch = E.EnvList([CountingEnv(term_every=2), CountingEnv(term_every=3)])
    out = _row_out(2, np.zeros(1, np.float32))
    batch.reset(out.obs)
    act = np.array([1, 2])
    first = batch.step(act, out._replace(t=0))
    assert isinstance(first, E.Stepped)
    assert list(first.ended) == [] and list(first.lost) == []
    assert not first.casts
    assert out.rew.tolist() == [1.0, 2.0] and out.rew.dtype == np.float64
    second = batch.step(act, out._replace(t=1))
    assert second.ended == [0] and not second.lost and not second.casts
    assert out.fin.tolist() == [True, False]
    assert out.final[0, 0] == 2 and out.obs[0, 0] == 100  # reset


def test_cast_problems_are_records_naming_the_column_and_step():
    def obs(episode, t):
        return 2.7 if t == 1 else 1

    def env():
        return SpacesEnv(spaces.Discrete(3), spaces.Discrete(2), obs)

    out = _row_out(3, np.zeros((), np.int64), final=False)
    batch = E.EnvConcat([E.EnvList([env()]), E.EnvList([env(), env()])])
    assert batch.reset(out.obs, check_casts=True) == []
    act = np.zeros(3, np.int64)
    stepped = batch.step(act, out._replace(t=4), check_casts=True)
    assert [cast.column for cast in stepped.casts] == [0, 1, 2]
    cast = stepped.casts[2]
    assert (cast.t, cast.reset) == (4, False)
    assert cast.label == "env 2 step 4"
    assert "2.7 does not fit its space's dtype int64" in cast.problem
    # unchecked: recorded (as 2) and not reported
    unchecked = E.EnvList([env()])
    out = _row_out(1, np.zeros((), np.int64), final=False)
    unchecked.reset(out.obs)
    assert not unchecked.step(act[:1], out).casts and out.obs[0] == 2
    assert E.Cast(1, None, True, "x").label == "env 1 reset()"
    assert E.Cast(1, 3, True, "x").label == "env 1 step 3, reset()"
