"""Returns and GAE against brute-force references written from the
definitions in ``rlplay.engine.returns`` (per env, per row, plain loops)."""
import numpy as np
import pytest
import torch

from envs import CountingEnv
from rlplay.engine import BaseActorModule
from rlplay.engine.nested import suply
from rlplay.engine.returns import frozen, gae, returns, terminated
from rlplay.engine.rollout import same


def random_fragment(seed, n_steps=9, n_envs=6, p_end=0.3):
    rng = np.random.default_rng(seed)
    T1 = n_steps + 1
    fin = rng.random((T1, n_envs)) < p_end
    truncated = fin & (rng.random((T1, n_envs)) < 0.5)
    # make sure both kinds of end occur, also at the last row
    fin[-1, 0] = truncated[-1, 0] = True
    fin[-1, 1], truncated[-1, 1] = True, False
    fin[1, 2] = truncated[1, 2] = True
    fin[2, 3], truncated[2, 3] = True, False
    rew = rng.normal(size=(T1, n_envs))
    value = rng.normal(size=(T1, n_envs))
    value_final = rng.normal(size=(T1, n_envs))
    return {name: torch.from_numpy(x) for name, x in dict(
        rew=rew, fin=fin, truncated=truncated, value=value,
        value_final=value_final).items()}


def ref_return(f, t, j, gamma, n):
    """The discounted return of the action in row t of env j: sum rewards
    forward until an episode end (adding the final observation's value if
    it was a truncation), the n-th step or row T (adding that row's value)."""
    rew, fin, trunc = f["rew"][:, j], f["fin"][:, j], f["truncated"][:, j]
    value, value_final = f["value"][:, j], f["value_final"][:, j]
    T = len(rew) - 1
    total, discount, row, steps = 0.0, 1.0, t, 0
    while True:
        row, steps = row + 1, steps + 1
        total += discount * float(rew[row])
        discount *= gamma
        if fin[row]:
            if trunc[row]:
                total += discount * float(value_final[row])
            return total
        if row == T or (n is not None and steps == n):
            return total + discount * float(value[row])


def ref_gae(f, t, j, gamma, lam):
    """The (gamma * lam)-weighted sum of one-step TD errors from row t to
    the end of its episode or of the fragment."""
    rew, fin, trunc = f["rew"][:, j], f["fin"][:, j], f["truncated"][:, j]
    value, value_final = f["value"][:, j], f["value_final"][:, j]
    T = len(rew) - 1
    total, weight = 0.0, 1.0
    for row in range(t, T):
        nxt = row + 1
        if fin[nxt]:
            boot = float(value_final[nxt]) if trunc[nxt] else 0.0
        else:
            boot = float(value[nxt])
        total += weight * (float(rew[nxt]) + gamma * boot - float(value[row]))
        if fin[nxt]:
            break
        weight *= gamma * lam
    return total


def reference(f, fn, **kwargs):
    T, B = f["rew"].shape[0] - 1, f["rew"].shape[1]
    return torch.tensor([[fn(f, t, j, **kwargs) for j in range(B)]
                         for t in range(T)], dtype=torch.float64)


def call(fn, f, **kwargs):
    return fn(f["rew"], f["fin"], f["truncated"], f["value"],
              f["value_final"], **kwargs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("n", [None, 1, 3, "T"])
def test_returns_match_the_reference(seed, gamma, n):
    f = random_fragment(seed)
    T = f["rew"].shape[0] - 1
    n = T if n == "T" else n
    got = call(returns, f, gamma=gamma, n=n)
    assert got.shape == (T, 6)
    torch.testing.assert_close(got, reference(f, ref_return, gamma=gamma,
                                              n=n), rtol=0, atol=1e-10)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.9, 0.0),
                                        (1.0, 1.0), (0.5, 0.5), (0.0, 0.7)])
def test_gae_matches_the_reference(seed, gamma, lam):
    f = random_fragment(seed)
    got = call(gae, f, gamma=gamma, lam=lam)
    torch.testing.assert_close(got, reference(f, ref_gae, gamma=gamma,
                                              lam=lam), rtol=0, atol=1e-10)


def test_returns_with_n_beyond_the_fragment_equal_n_none():
    f = random_fragment(7, n_steps=5)
    full = call(returns, f, gamma=0.9)
    for n in (5, 6, 100):
        torch.testing.assert_close(call(returns, f, gamma=0.9, n=n), full)


def test_gae_identities():
    f = random_fragment(11)
    value = f["value"][:-1]
    # lambda = 1: advantages + values are the full returns
    torch.testing.assert_close(call(gae, f, gamma=0.97, lam=1.0) + value,
                               call(returns, f, gamma=0.97))
    # lambda = 0: the one-step TD error
    torch.testing.assert_close(call(gae, f, gamma=0.97, lam=0.0) + value,
                               call(returns, f, gamma=0.97, n=1))


def test_hand_computed_example():
    # one env, T = 4: rewards 1 2 3 4; row 2 truncated (final value 10),
    # row 4 terminated; values 0.5 everywhere
    rew = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])
    fin = torch.tensor([[True], [False], [True], [False], [True]])
    trunc = torch.tensor([[False], [False], [True], [False], [False]])
    value = torch.full((5, 1), 0.5)
    value_final = torch.full((5, 1), 10.0)
    G = returns(rew, fin, trunc, value, value_final, gamma=0.5)
    # G3 = 4; G2 = 3 + .5 * 4 = 5; G1 = 2 + .5 * 10 = 7; G0 = 1 + .5 * 7
    assert G[:, 0].tolist() == [4.5, 7.0, 5.0, 4.0]
    G = returns(rew, fin, trunc, value, value_final, gamma=0.5, n=1)
    assert G[:, 0].tolist() == [1.25, 7.0, 3.25, 4.0]
    adv = gae(rew, fin, trunc, value, value_final, gamma=0.5, lam=0.5)
    # deltas: 1 + .25 - .5, 2 + 5 - .5, 3 + .25 - .5, 4 - .5
    d = [0.75, 6.5, 2.75, 3.5]
    assert adv[:, 0].tolist() == [d[0] + 0.25 * d[1], d[1],
                                  d[2] + 0.25 * d[3], d[3]]


def test_truncations_need_final_values():
    f = random_fragment(0)
    with pytest.raises(ValueError, match="the fragment has truncations: "
                                         "pass value_final"):
        returns(f["rew"], f["fin"], f["truncated"], f["value"], gamma=0.9)
    with pytest.raises(ValueError, match="pass value_final"):
        gae(f["rew"], f["fin"], f["truncated"], f["value"], gamma=0.9,
            lam=0.9)


def test_a_truncation_at_row_zero_needs_no_final_value():
    # row 0 belongs to the previous fragment
    rew = torch.ones(3, 1)
    fin = torch.tensor([[True], [False], [False]])
    trunc = torch.tensor([[True], [False], [False]])
    G = returns(rew, fin, trunc, torch.zeros(3, 1), gamma=1.0)
    assert G[:, 0].tolist() == [2.0, 1.0]


def test_n_must_be_positive():
    f = random_fragment(0)
    for n in (0, -1):
        with pytest.raises(ValueError, match=f"n must be at least 1, got {n}"):
            call(returns, f, gamma=0.9, n=n)


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan")])
def test_a_discount_or_lambda_outside_zero_one_is_refused(bad):
    f = random_fragment(0)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        call(returns, f, gamma=bad)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        call(gae, f, gamma=bad, lam=0.9)
    with pytest.raises(ValueError, match=r"lam must be in \[0, 1\]"):
        call(gae, f, gamma=0.9, lam=bad)


def test_terminated():
    fin = torch.tensor([True, True, False])
    trunc = torch.tensor([True, False, False])
    assert terminated(fin, trunc).tolist() == [False, True, False]


# from a real fragment

class Walk(BaseActorModule):
    """Acts 1 + stepno % 3: a fixed policy so the fragment is exact."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        return 1 + stepno % 3, (), {}

    def reset(self, hx, at):
        return ()


def test_returns_from_a_collected_fragment():
    made = []

    def factory():  # time limits of 3, 4, 5 and 6 steps
        made.append(None)
        return CountingEnv(term_every=4, trunc_at=2 + len(made))

    with same.rollout(factory, Walk(), 12, 4, entropy=3) as feed:
        batch = next(feed)
    fin, trunc = batch.state.fin, batch.truncated
    assert (fin & trunc).any() and (fin & ~trunc)[1:].any()
    # a stand-in value function: a fixed function of the observation
    value = torch.sin(batch.state.obs[..., 0].double() / 7)
    value_final = torch.sin(batch.final[..., 0].double() / 7)
    f = {"rew": batch.state.rew.double(), "fin": fin, "truncated": trunc,
         "value": value, "value_final": value_final}
    for n in (None, 2):
        torch.testing.assert_close(call(returns, f, gamma=0.9, n=n),
                                   reference(f, ref_return, gamma=0.9, n=n))
    torch.testing.assert_close(call(gae, f, gamma=0.9, lam=0.8),
                               reference(f, ref_gae, gamma=0.9, lam=0.8))


# sticky fragments: frozen rows

def sticky_fragments(n_fragments=2):
    """Two sticky fragments of T = 5 from two CountingEnvs under Walk
    (act = reward = 1 + stepno % 3): env 0 terminates every 2 steps, env 1
    is truncated at 3 steps."""
    from rlplay.engine.core import collect, prepare, startup

    envs = [CountingEnv(term_every=2), CountingEnv(trunc_at=3)]
    actor = Walk()
    buffer = prepare(envs[0], actor, 5, 2)
    ctx = startup(envs, actor, buffer)
    fragments = []
    for _ in range(n_fragments):
        collect(actor, buffer, ctx, sticky=True)
        fragments.append(suply(torch.clone, buffer.pyt))
    return fragments


def test_frozen_rows_of_sticky_fragments():
    for fragment in sticky_fragments():
        fin = fragment.state.fin
        # env 0 ends at row 2, env 1 at row 3; row 0 (an end in the first
        # fragment's reset row and in the second's previous row T) freezes
        # nothing
        assert fin.T.int().tolist() == [[1, 0, 1, 1, 1, 1],
                                        [1, 0, 0, 1, 1, 1]]
        assert frozen(fin).T.int().tolist() == [[0, 0, 0, 1, 1, 1],
                                                [0, 0, 0, 0, 1, 1]]
        assert frozen(fin.numpy()).equal(frozen(fin))


def test_returns_and_gae_with_the_frozen_mask():
    fragment = sticky_fragments(1)[0]
    state = fragment.state
    assert state.rew.T.tolist() == [[0, 1, 2, 0, 0, 0], [0, 1, 2, 3, 0, 0]]
    assert fragment.truncated.T.int().tolist()[1] == [0, 0, 0, 1, 0, 0]
    args = (state.rew.double(), state.fin, fragment.truncated,
            torch.full((6, 2), 0.5, dtype=torch.float64),
            torch.full((6, 2), 10.0, dtype=torch.float64))
    mask = frozen(state.fin)
    # env 0: G1 = 2 (terminated), G0 = 1 + .5 * 2; env 1: G2 = 3 + .5 * 10
    # (truncated), G1 = 2 + .5 * 8, G0 = 1 + .5 * 6; frozen rows give 0
    G = returns(*args, gamma=0.5, mask=mask)
    assert G.T.tolist() == [[2, 2, 0, 0, 0], [4, 6, 8, 0, 0]]
    assert returns(*args, gamma=0.5).equal(G)  # 0 there anyway
    assert returns(*args, gamma=0.5, n=1, mask=mask).T.tolist() == \
        [[1.25, 2, 0, 0, 0], [1.25, 2.25, 8, 0, 0]]
    # without the mask a frozen row's advantage is -value
    adv = gae(*args, gamma=0.5, lam=1.0)
    assert adv.T.tolist() == [[1.5, 1.5, -0.5, -0.5, -0.5],
                              [3.5, 5.5, 7.5, -0.5, -0.5]]
    adv = gae(*args, gamma=0.5, lam=1.0, mask=mask)
    assert adv.T.tolist() == [[1.5, 1.5, 0, 0, 0], [3.5, 5.5, 7.5, 0, 0]]
    # the masked rows are exactly the actions that were never executed
    live = ~mask[1:]
    assert live.T.int().tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]


def test_frozen_rejects_a_fragment_that_is_not_sticky():
    fin = torch.tensor([[1], [0], [1], [0], [1]]).bool()  # goes on at row 3
    with pytest.raises(ValueError, match=r"not a sticky fragment: env 0 "
                                         r"goes on at row 3"):
        frozen(fin)
    with pytest.raises(ValueError, match=r"fin must be a bool tensor of "
                                         r"shape \(1 \+ T, B\), got "
                                         r"torch.int64 of shape \(5, 1\)"):
        frozen(fin.long())


def test_mask_must_match_fin():
    f = random_fragment(0)
    with pytest.raises(ValueError, match=r"mask must be a bool tensor "
                                         r"shaped as fin \(10, 6\), got "
                                         r"torch.bool of shape \(9, 6\)"):
        call(returns, f, gamma=0.9, mask=f["fin"][1:])
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        call(gae, f, gamma=0.9, lam=0.9, mask=f["fin"].int())
