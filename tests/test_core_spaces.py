"""Space checks in the core loops: actions and observations against the
env's spaces (``check_spaces`` of ``collect`` and ``evaluate``), and the
vectorised checkers of ``rlplay.engine.envs`` they use."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from envs import CountingEnv, SpacesEnv, StructuredEnv
from rlplay.engine import BaseActorModule
from rlplay.engine.core import collect, evaluate, prepare, startup
from rlplay.engine.envs import space_checker

HINT = r" \(check_spaces='never' turns these checks off\)"
BOX4 = spaces.Box(-1.0, 1.0, (4,), np.float32)


class Scripted(BaseActorModule):
    """Acts ``default`` everywhere but ``bad`` at (step ``t`` of the
    actor's life, env ``j``) for each ``(t, j)`` in ``at``; steps count
    real calls only. ``dtype`` and ``shape`` (per env) as the space's."""

    def __init__(self, default=0, bad=7, at=(), dtype=torch.int64,
                 shape=()):
        super().__init__()
        self.default, self.bad, self.at = default, bad, set(at)
        self.dtype, self.shape, self.t = dtype, shape, 0

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        n_envs = fin.shape[1]
        action = torch.full((1, n_envs, *self.shape), self.default,
                            dtype=self.dtype)
        if not virtual:
            for t, j in self.at:
                if t == self.t:
                    action[0, j] = self.bad
            self.t += 1
        return action, (), {}

    def reset(self, hx, at):
        return ()


def constant(value):
    return lambda episode, t: np.asarray(value, np.float32)


def run(envs, actor, n_steps=8, n_fragments=1, **kwargs):
    buffer = prepare(envs[0], actor, n_steps, len(envs))
    ctx = startup(envs, actor, buffer)
    for _ in range(n_fragments):
        collect(actor, buffer, ctx, **kwargs)
    return buffer, ctx


# the actor's actions

def test_action_outside_a_discrete_space_names_env_step_and_value():
    envs = [CountingEnv() for _ in range(4)]
    envs_ok = [CountingEnv() for _ in range(4)]
    for env in envs + envs_ok:
        env.action_space = spaces.Discrete(3)
    with pytest.raises(ValueError, match=r"^env 3 step 5: the actor's "
                                         r"action 7 is outside the action "
                                         r"space Discrete\(3\)" + HINT):
        run(envs, Scripted(at=[(5, 3)]))
    # before the env got it: env 3 took 5 steps, the others 5 too
    assert [env.t for env in envs] == [5] * 4
    run(envs_ok, Scripted(default=2))  # 0..2 are fine


def test_action_below_the_start_of_a_discrete_space():
    envs = [CountingEnv(), CountingEnv()]
    for env in envs:
        env.action_space = spaces.Discrete(3, start=1)
    run(envs, Scripted(default=1, bad=3, at=[(0, 0)]))  # 1..3 valid
    envs = [CountingEnv(), CountingEnv()]
    for env in envs:
        env.action_space = spaces.Discrete(3, start=1)
    with pytest.raises(ValueError, match=r"env 1 step 2: the actor's action "
                                         r"0 is outside the action space "
                                         r"Discrete\(3, start=1\)"):
        run(envs, Scripted(default=1, bad=0, at=[(2, 1)]))


def test_multidiscrete_and_multibinary_actions():
    def envs_with(action_space):
        return [SpacesEnv(BOX4, action_space, constant(np.zeros(4)))
                for _ in range(2)]

    envs = envs_with(spaces.MultiDiscrete([2, 3]))
    with pytest.raises(ValueError, match=r"env 0 step 1: the actor's action "
                                         r"\[1, 3\] is outside the action "
                                         r"space MultiDiscrete\(\[2 3\]\)"):
        run(envs, Scripted(default=1, bad=torch.tensor([1, 3]),
                           at=[(1, 0)], shape=(2,)))
    envs = envs_with(spaces.MultiBinary(3))
    with pytest.raises(ValueError, match=r"env 1 step 0: the actor's action "
                                         r"\[0, 2, 0\] is outside the "
                                         r"action space MultiBinary\(3\)"):
        run(envs, Scripted(default=0, bad=torch.tensor([0, 2, 0]),
                           at=[(0, 1)], dtype=torch.int8, shape=(3,)))


@pytest.mark.parametrize("check_spaces", ["first", "always", "never"])
def test_box_actions_reach_the_env_clipped_and_are_recorded_as_chosen(
        check_spaces):
    """A Gaussian policy samples outside its Box (actions of +-13 reached
    HalfCheetah, which charges its control cost on the action as given):
    every action is clipped before the env gets it, whatever
    check_spaces says, and state.act records what the actor chose (the
    action its logp belongs to)."""
    envs = [SpacesEnv(BOX4, BOX4, constant(np.zeros(4))) for _ in range(2)]
    buffer, _ = run(envs, Scripted(default=13.0, bad=-13.0, at=[(2, 1)],
                                   dtype=torch.float32, shape=(4,)),
                    n_fragments=2, check_spaces=check_spaces)
    act = buffer.npy.state.act
    assert ((act[1:] == 13.0) | (act[1:] == -13.0)).all()
    for env in envs:  # what the envs executed, step by step
        assert all(np.array_equal(a, np.clip(a, -1, 1)) for a in env.actions)
    # the one -13 (step 2 of the first fragment, env 1) reached env 1 as -1
    assert np.array_equal(envs[1].actions[2], -np.ones(4, np.float32))
    assert np.array_equal(envs[0].actions[2], np.ones(4, np.float32))
    # the second fragment's rows, clipped, are what env 1 executed after it
    np.testing.assert_array_equal(np.clip(act[1:, 1], -1, 1),
                                  np.stack(envs[1].actions[8:]))


def test_nan_box_actions_are_refused_not_clipped():
    envs = [SpacesEnv(BOX4, BOX4, constant(np.zeros(4))) for _ in range(2)]
    with pytest.raises(ValueError, match=r"env 1 step 3: the actor's action "
                                         r"holds nan, outside the action "
                                         r"space Box\(-1.0, 1.0, \(4,\), "
                                         r"float32\)"):
        run(envs, Scripted(default=0.0, bad=float("nan"), at=[(3, 1)],
                           dtype=torch.float32, shape=(4,)))


def test_nested_box_actions_are_clipped_and_evaluate_clips_too():
    class Wide(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            shape = fin.shape
            return (torch.full(shape, 2, dtype=torch.int64),
                    torch.tensor([-5.0, 0.25]).expand(*shape, 2)), (), {}

        def reset(self, hx, at):
            return ()

    envs = [StructuredEnv(), StructuredEnv()]
    buffer, _ = run(envs, Wide())
    discrete, box = buffer.npy.state.act
    assert (discrete[1:] == 2).all()
    assert (box[1:] == np.float32([-5.0, 0.25])).all()  # as chosen
    # the reward is a0 + sum(a1) of the action the env executed
    assert (buffer.npy.state.rew[1:] == np.float32(2 - 1.0 + 0.25)).all()
    returns, lengths = evaluate([StructuredEnv()], Wide(), 1)
    assert returns[0] == lengths[0] * (2 - 1.0 + 0.25)


def test_nested_actions_name_the_leaf():
    class Bad(BaseActorModule):
        def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
            shape = fin.shape
            return (torch.full(shape, 3, dtype=torch.int64),
                    torch.zeros(*shape, 2)), (), {}

        def reset(self, hx, at):
            return ()

    envs = [StructuredEnv(), StructuredEnv()]
    with pytest.raises(ValueError, match=r"env 0 step 0: the actor's "
                                         r"action\[0\] 3 is outside "
                                         r"Discrete\(3\), at \[0\] of the "
                                         r"action space"):
        run(envs, Bad())


# observations

def test_nan_in_a_reset_observation():
    def obs(episode, t):
        return np.full(4, np.nan if episode == 0 else 0.0, np.float32)

    envs = [SpacesEnv(BOX4, spaces.Discrete(2), obs),
            SpacesEnv(BOX4, spaces.Discrete(2), constant(np.zeros(4)))]
    with pytest.raises(ValueError, match=r"^env 0 reset\(\): the observation "
                                         r"holds nan, outside the "
                                         r"observation space Box\(-1.0, "
                                         r"1.0, \(4,\), float32\)" + HINT):
        run(envs, Scripted())


def test_observation_out_of_bounds_mid_episode():
    def obs(episode, t):
        return np.full(4, 3.0 if t == 4 else 0.5, np.float32)

    envs = [SpacesEnv(BOX4, spaces.Discrete(2), constant(np.zeros(4))),
            SpacesEnv(BOX4, spaces.Discrete(2), obs)]
    # the observation of step 3 (the env's 4th step)
    with pytest.raises(ValueError, match=r"env 1 step 3: the observation "
                                         r"\[3., 3., 3., 3.\] is outside "
                                         r"the observation space"):
        run(envs, Scripted())


def test_bad_observation_after_an_automatic_reset():
    def obs(episode, t):
        return np.full(4, 2.0 if episode == 1 else 0.0, np.float32)

    envs = [SpacesEnv(BOX4, spaces.Discrete(2), obs, term_every=3)]
    with pytest.raises(ValueError, match=r"env 0 step 2, reset\(\): the "
                                         r"observation \[2., 2., 2., 2.\] "
                                         r"is outside"):
        run(envs, Scripted())


def test_bad_final_observation():
    # the true last observation of an episode is checked too
    def obs(episode, t):
        return np.full(4, -9.0 if t == 3 else 0.0, np.float32)

    envs = [SpacesEnv(BOX4, spaces.Discrete(2), obs, term_every=3)]
    with pytest.raises(ValueError, match=r"env 0 step 2: the observation "
                                         r"\[-9., -9., -9., -9.\] is "
                                         r"outside"):
        run(envs, Scripted())


def test_large_observation_names_the_first_bad_element():
    box = spaces.Box(0, 255, (8, 8), np.uint8)

    def obs(episode, t):
        image = np.zeros((8, 8), np.float32)
        image[2, 5] = 300.0 if t == 1 else 0.0
        return image

    # 300 does not fit uint8: the cast check reports what was recorded
    with pytest.raises(ValueError, match=r"env 0 step 0: the observation "
                                         r"holds 300.0 at \[2, 5\], which "
                                         r"its space's dtype uint8 records "
                                         r"as 44"):
        run([SpacesEnv(box, spaces.Discrete(2), obs)], Scripted())
    box = spaces.Box(-1.0, 1.0, (8, 8), np.float32)
    with pytest.raises(ValueError, match=r"env 0 step 0: the observation "
                                         r"holds 300.0 at \[2, 5\], outside "
                                         r"the observation space Box\(-1.0, "
                                         r"1.0, \(8, 8\), float32\)"):
        run([SpacesEnv(box, spaces.Discrete(2), obs)], Scripted())


def test_non_integral_and_out_of_range_discrete_observations():
    # 2.7 would be recorded as 2 in the int64 buffer: caught before that
    def obs(episode, t):
        return 2.7 if t == 2 else 1

    env = SpacesEnv(spaces.Discrete(3), spaces.Discrete(2), obs)
    with pytest.raises(ValueError, match=r"env 0 step 1: the observation "
                                         r"2.7 does not fit its space's "
                                         r"dtype int64 \(recorded as 2\)"):
        run([env], Scripted())

    def obs(episode, t):
        return 5 if t == 2 else 1

    env = SpacesEnv(spaces.Discrete(3), spaces.Discrete(2), obs)
    with pytest.raises(ValueError, match=r"env 0 step 1: the observation 5 "
                                         r"is outside the observation space "
                                         r"Discrete\(3\)"):
        run([env], Scripted())


def test_dict_observation_names_the_key():
    space = spaces.Dict({"pos": BOX4, "flag": spaces.Discrete(2)})

    def obs(episode, t):
        return {"pos": np.zeros(4, np.float32), "flag": 2 if t == 1 else 0}

    with pytest.raises(ValueError, match=r"env 0 step 0: the "
                                         r"observation\['flag'\] 2 is "
                                         r"outside Discrete\(2\), at "
                                         r"\['flag'\] of the observation "
                                         r"space"):
        run([SpacesEnv(space, spaces.Discrete(2), obs)], Scripted())


def test_reset_values_that_do_not_fit_the_dtype_or_the_range():
    # startup records them; the first checking collect reports them
    def check(value, message):
        def obs(episode, t):
            return value if episode == 0 else 0

        envs = [SpacesEnv(spaces.Discrete(3), spaces.Discrete(2), obs)
                for _ in range(2)]
        actor = Scripted()
        buffer = prepare(envs[0], actor, 2, 2)
        ctx = startup(envs, actor, buffer)
        with pytest.raises(ValueError, match=message):
            collect(actor, buffer, ctx)
        assert [env.t for env in envs] == [0, 0]  # before any step

    check(1.5, r"^env 0 reset\(\): the observation 1.5 does not fit its "
               r"space's dtype int64 \(recorded as 1\)" + HINT)
    check(-1, r"^env 0 reset\(\): the observation -1 is outside the "
              r"observation space Discrete\(3\)" + HINT)


# when: check_spaces

def late_bad_actor():
    # a bad action in the second fragment of 4 steps only
    return Scripted(default=1, bad=9, at=[(5, 0)])


def discrete_envs():
    envs = [CountingEnv(), CountingEnv()]
    for env in envs:
        env.action_space = spaces.Discrete(3)
    return envs


def test_first_checks_the_first_fragment_only():
    run(discrete_envs(), late_bad_actor(), n_steps=4, n_fragments=2)
    run(discrete_envs(), late_bad_actor(), n_steps=4, n_fragments=2,
        check_spaces="first")


def test_always_checks_every_fragment():
    with pytest.raises(ValueError, match=r"env 0 step 1: the actor's action "
                                         r"9 is outside"):
        run(discrete_envs(), late_bad_actor(), n_steps=4, n_fragments=2,
            check_spaces="always")


def test_never_checks_nothing():
    envs = discrete_envs()
    buffer, _ = run(envs, Scripted(bad=9, at=[(0, 0)]), n_steps=4,
                    check_spaces="never")
    assert buffer.npy.state.act[1, 0] == 9


def test_first_is_tracked_on_the_context_not_its_seq():
    # a context may start with a nonzero seq (a restarted worker's): its
    # first fragment is still checked, and a second one is not
    envs = discrete_envs()
    actor = Scripted(default=1, bad=9, at=[(1, 1)])
    buffer = prepare(envs[0], actor, 4, 2)
    ctx = startup(envs, actor, buffer)
    ctx.seq = 12
    assert not ctx.spaces_checked
    with pytest.raises(ValueError, match="env 1 step 1: the actor's action "
                                         "9"):
        collect(actor, buffer, ctx)
    # a failed fragment checked nothing for good: the next one checks again
    assert not ctx.spaces_checked
    actor.at = {(actor.t + 2, 0)}
    with pytest.raises(ValueError, match="env 0 step 2"):
        collect(actor, buffer, ctx)
    # a whole checked fragment, then none
    envs = discrete_envs()
    buffer = prepare(envs[0], actor, 4, 2)
    ctx = startup(envs, actor, buffer)
    ctx.seq = 3
    actor.at = set()
    collect(actor, buffer, ctx)
    assert ctx.spaces_checked
    actor.at = {(actor.t + 1, 0)}
    collect(actor, buffer, ctx)  # not checked
    assert buffer.npy.state.act[2, 0] == 9


def test_never_then_first_checks_the_next_fragment():
    envs = discrete_envs()
    actor = Scripted(default=1, bad=9, at=[(1, 0), (5, 1)])
    buffer = prepare(envs[0], actor, 4, 2)
    ctx = startup(envs, actor, buffer)
    collect(actor, buffer, ctx, check_spaces="never")
    assert not ctx.spaces_checked
    with pytest.raises(ValueError, match="env 1 step 1: the actor's action "
                                         "9"):
        collect(actor, buffer, ctx)


@pytest.mark.parametrize("value", ["sometimes", "FIRST", True, None, 1])
def test_check_spaces_must_be_one_of_three(value):
    envs = discrete_envs()
    actor = Scripted()
    buffer = prepare(envs[0], actor, 2, 2)
    ctx = startup(envs, actor, buffer)
    with pytest.raises(ValueError, match=r"check_spaces must be one of "
                                         r"'first', 'always' or 'never', got "
                                         + repr(value)):
        collect(actor, buffer, ctx, check_spaces=value)
    assert [env.t for env in envs] == [0, 0]  # checked up front
    with pytest.raises(ValueError, match="check_spaces must be one of"):
        evaluate(envs, actor, 1, check_spaces=value)


# evaluate

def test_evaluate_checks_actions_and_observations():
    envs = discrete_envs()
    for env in envs:
        env.term_every = 3
    with pytest.raises(ValueError, match=r"env 1 step 2: the actor's action "
                                         r"7 is outside the action space "
                                         r"Discrete\(3\)"):
        evaluate(envs, Scripted(at=[(2, 1)]), 2)

    def obs(episode, t):
        return np.full(4, np.nan if (episode, t) == (1, 0) else 0.0,
                       np.float32)

    env = SpacesEnv(BOX4, spaces.Discrete(2), obs, term_every=2)
    with pytest.raises(ValueError, match=r"env 0 step 1, reset\(\): the "
                                         r"observation holds nan"):
        evaluate([env], Scripted(), 2)
    env = SpacesEnv(BOX4, spaces.Discrete(2), obs, term_every=2)
    returns, lengths = evaluate([env], Scripted(), 2, check_spaces="never")
    assert lengths.tolist() == [2, 2]


def test_evaluate_first_checks_until_every_env_ended_an_episode():
    def envs():
        made = discrete_envs()
        made[0].term_every, made[1].term_every = 2, 4
        return made

    # two episodes each: env 0 ends at steps 1 and 3 (counted from 0), env
    # 1 at steps 3 and 7; a bad action at step 3 is checked, one at step 4
    # (env 1's second episode) only with 'always'
    with pytest.raises(ValueError, match="env 0 step 3"):
        evaluate(envs(), Scripted(at=[(3, 0)]), 4)
    evaluate(envs(), Scripted(default=1, at=[(4, 1)]), 4)
    with pytest.raises(ValueError, match="env 1 step 4"):
        evaluate(envs(), Scripted(default=1, at=[(4, 1)]), 4,
                 check_spaces="always")


# the checkers themselves

def test_space_checker_on_batches():
    check = space_checker(spaces.Discrete(3, start=-1))
    assert check(np.array([-1, 0, 1])) is None
    assert check(np.array([-1, 2, 1])) == (
        1, "the value 2 is outside the space Discrete(3, start=-1)")
    assert check(np.array([0.0, 0.5]))[0] == 1  # not integral
    check = space_checker(spaces.MultiDiscrete([2, 3], start=[1, 0]))
    assert check(np.array([[1, 0], [2, 2]])) is None
    assert check(np.array([[1, 0], [0, 2]]))[0] == 1
    check = space_checker(spaces.MultiBinary(2))
    assert check(np.array([[0, 1], [1, 1]], np.int8)) is None
    assert check(np.array([[0, 1], [-1, 1]], np.int8))[0] == 1
    box = spaces.Box(np.float32([-np.inf, 0]), np.float32([np.inf, 1]))
    check = space_checker(box, "x", "the box")
    assert check(np.array([[-1e30, 0.5], [7.0, 1.0]], np.float32)) is None
    assert check(np.array([[0, 0.5], [0, 1.5]], np.float32)) == (
        1, "x [0. , 1.5] is outside the box Box([-inf   0.], [inf  1.], "
           "(2,), float32)")
    assert check(np.array([[np.nan, 0.5]], np.float32)) == (
        0, "x holds nan, outside the box Box([-inf   0.], [inf  1.], (2,), "
           "float32)")
    check = space_checker(box, box_bounds=False)
    assert check(np.array([[0, 9.0]], np.float32)) is None
    assert check(np.array([[0, np.nan]], np.float32))[0] == 0


def test_space_checker_walks_dicts_and_tuples():
    space = spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2), BOX4)),
                         "b": spaces.MultiBinary(1)})
    check = space_checker(space, "obs", "its space")
    batch = {"a": (np.array([0, 1, 1]), np.zeros((3, 4), np.float32)),
             "b": np.array([[0], [1], [0]], np.int8)}
    assert check(batch) is None
    batch["a"][1][2, 3] = np.nan
    assert check(batch) == (
        2, "obs['a'][1] holds nan, outside Box(-1.0, 1.0, (4,), float32), "
           "at ['a'][1] of its space")


def test_space_checker_rejects_unsupported_spaces():
    with pytest.raises(TypeError, match="unsupported space"):
        space_checker(spaces.Text(3))
