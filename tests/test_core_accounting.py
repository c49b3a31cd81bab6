"""The episode accounting and the policy seam of core, without envs."""
import numpy as np
import pytest
import torch

from rlplay.engine import BaseActorModule
from rlplay.engine.core import LocalPolicy
from rlplay.engine.core.accounting import Accounts, TorchAccounts


def test_fragment_accounts_count_steps_and_close_episodes():
    acc = Accounts(3)
    stepno = np.full((5, 3), -1, np.int64)  # T = 4
    stepno[0] = [2, 0, 7]
    ret, length = np.zeros(3), np.zeros(3, np.int64)
    rew_row = np.zeros(3, np.float32)
    acc.rew[:] = [0.1, 1.0, 2.0]
    acc.add(acc.rew, rew_row, stepno[0], stepno[1])
    assert rew_row.tolist() == pytest.approx([0.1, 1.0, 2.0])
    assert stepno[1].tolist() == [3, 1, 8]
    assert stepno[2:].tolist() == [[-1] * 3] * 3  # not stepped yet
    acc.add(acc.rew, rew_row, stepno[1], stepno[2])
    # column 0 ends at row 2; column 1's call at row 2 was lost
    acc.end([0], stepno[1], stepno[2], ret, length)
    acc.lose([1], stepno[2])
    assert ret[0] == 0.1 + 0.1 and length[0] == 2 + 1 + 1
    assert acc.ret.tolist() == [0.0, 2.0, 4.0]
    acc.add(acc.rew, rew_row, stepno[2], stepno[3])
    acc.add(acc.rew, rew_row, stepno[3], stepno[4])
    assert stepno[:, 0].tolist() == [2, 3, 0, 1, 2]
    assert stepno[:, 1].tolist() == [0, 1, 0, 1, 2]
    assert stepno[:, 2].tolist() == [7, 8, 9, 10, 11]
    acc.end([1, 2], stepno[3], stepno[4], ret, length)  # several at once
    assert ret[1:].tolist() == [4.0, 8.0] and length[1:].tolist() == [2, 11]
    assert stepno[4].tolist() == [2, 0, 0]
    acc.finish(stepno[4])
    assert acc.length.tolist() == [2, 0, 0]


@pytest.mark.parametrize("many", [3, 12])
def test_many_ends_and_lost_calls_at_once(many):
    """Columns that end or lose a call together (a vector source) are
    accounted as one at a time (few or many at once)."""
    B, T, t = 16, 6, 2
    together, apart = Accounts(B), Accounts(B)
    rows = {}
    for acc, key in ((together, "together"), (apart, "apart")):
        stepno = np.tile(np.arange(B), (T + 1, 1))
        acc.rew[:] = np.arange(B) / 2
        ret, length = np.zeros(B), np.zeros(B, np.int64)
        ended, lost = list(range(0, many)), list(range(many, B))[:many]
        for s in range(T):
            acc.add(acc.rew, np.zeros(B, np.float32), stepno[s], stepno[s + 1])
            if s != t:
                continue
            if key == "together":
                acc.end(ended, stepno[t], stepno[t + 1], ret, length)
                acc.lose(lost, stepno[t + 1])
            else:
                for j in ended:
                    acc.end([j], stepno[t], stepno[t + 1], ret, length)
                for j in lost:
                    acc.lose([j], stepno[t + 1])
        rows[key] = (stepno.tolist(), ret.tolist(), length.tolist(),
                     acc.ret.tolist())
    assert rows["together"] == rows["apart"]
    restarted = min(2 * many, B)  # the ended and lost columns
    stepno = np.array(rows["apart"][0])
    assert stepno[t + 1:, :restarted].tolist() == [
        [s] * restarted for s in range(T - t)]
    assert stepno[T, restarted:].tolist() == list(range(restarted + T, B + T))
    assert rows["apart"][2][:many] == list(range(t + 1, t + 1 + many))
    assert rows["apart"][1][:many] == [(t + 1) * j / 2 for j in range(many)]


def test_settled_accounts_are_those_kept_step_by_step():
    """The fragment loop's deferred accounts (record each row, settle after
    the rows) give what add and end give step by step, bit for bit: the
    same float64 sums in the same order, a return carried from fragment
    to fragment, starting from 0 after each end (a NaN reward spoils its
    own episode's return, not the next), the statistics only where an
    episode ended."""
    rng = np.random.default_rng(3)
    B, T = 5, 7
    stepped, settled = Accounts(B), Accounts(B)
    stepno = {key: np.zeros((T + 1, B), np.int64) for key in "ab"}
    for fragment in range(3):
        rew = rng.normal(size=(T, B)) * 1e3 + 1 / 3  # sums that round
        ended = rng.random((T, B)) < 0.3
        if fragment == 1:  # a NaN reward in an episode that ends at row 5
            rew[2, 3] = np.nan
            ended[:, 3] = False
            ended[4, 3] = True
        stats = {key: (np.zeros((T + 1, B)), np.zeros((T + 1, B), np.int64))
                 for key in "ab"}
        for key, acc in (("a", stepped), ("b", settled)):
            steps, (ret, length) = stepno[key], stats[key]
            steps[0] = steps[T]
            for t in range(T):
                if key == "a":
                    acc.rew[:] = rew[t]
                    acc.add(acc.rew, np.zeros(B, np.float32), steps[t],
                            steps[t + 1])
                    cols = np.flatnonzero(ended[t]).tolist()
                    if cols:
                        acc.end(cols, steps[t], steps[t + 1], ret[t + 1],
                                length[t + 1])
                else:
                    rew_row = np.zeros(B, np.float32)
                    acc.record(rew[t], rew_row, steps[t], steps[t + 1])
                    assert np.array_equal(rew_row, rew[t].astype(
                        np.float32), equal_nan=True)
                    steps[t + 1][ended[t]] = 0  # what the loop writes
            if key == "b":
                acc.settle(rew, ended, ret[1:], length[1:], steps[:-1])
            acc.finish(steps[T])
        assert np.array_equal(stepno["a"], stepno["b"])
        for a, b in zip(stats["a"], stats["b"]):
            assert np.array_equal(a, b, equal_nan=True)
        assert np.array_equal(stepped.ret, settled.ret, equal_nan=True)
        assert np.array_equal(stepped.length, settled.length)
        ret, length = stats["b"]
        assert length[1:][ended].min() > 0 and not length[1:][~ended].any()
        assert not ret[1:][~ended].any()
        if fragment == 1:  # the NaN spoilt its own episode's return only
            assert np.isnan(ret[5, 3]) and not np.isnan(settled.ret[3])
        else:
            assert not np.isnan(ret).any()
    assert not np.isnan(settled.ret).any()


def test_sticky_accounts_leave_frozen_columns_alone():
    acc = Accounts(2)
    stepno = np.zeros((3, 2), np.int64)
    stepno[0] = [4, 9]
    stepno[1, 0] = stepno[0, 0]  # what the loop's freeze writes
    rew_row = np.zeros(2, np.float32)
    acc.rew[:] = [5.0, 7.0]
    acc.add(acc.rew, rew_row, stepno[0], stepno[1], live=[1])
    assert rew_row.tolist() == [0.0, 7.0] and acc.ret.tolist() == [0.0, 7.0]
    assert stepno[1].tolist() == [4, 10]


def test_episode_accounts_count_where_asked():
    acc = Accounts(2)
    acc.rew[:] = [1.5, 2.5]
    acc.count(np.array([True, False]))
    acc.count(np.array([True, True]))
    assert acc.close(0) == (3.0, 2) and acc.close(1) == (2.5, 1)
    assert acc.ret.tolist() == [0.0, 0.0] and acc.length.tolist() == [0, 0]


def test_torch_episode_accounts_keep_the_same_accounts_with_masks():
    """TorchAccounts (a torch source's, masks) and Accounts (columns)
    count and close the same episodes alike: float64 sums of float32
    rewards as given."""
    rewards = np.array([[0.1, 2.5, -0.0], [0.7, 1.0, 3.0],
                        [0.3, 0.2, 1e-8]], np.float32)
    counted = np.array([[True, False, True], [True, True, False],
                        [True, True, True]])
    closing = np.array([[False, False, True], [False, True, False],
                        [True, False, False]])
    acc, tacc = Accounts(3), TorchAccounts(3, "cpu")
    for rew, count, close in zip(rewards, counted, closing):
        acc.rew[:] = rew
        acc.count(count)
        tacc.count(torch.from_numpy(rew), torch.from_numpy(count))
        ret, length = tacc.close(torch.from_numpy(close))
        for j in np.flatnonzero(close):
            assert (ret[j].item(), length[j].item()) == acc.close(j)
    assert tacc.ret.dtype == torch.float64
    assert tacc.ret.tolist() == acc.ret.tolist()
    assert tacc.length.tolist() == acc.length.tolist() == [0, 1, 1]


class Recording(BaseActorModule):
    """A feed-forward actor that logs its calls."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        self.calls.append("virtual" if virtual else "real")
        return torch.zeros_like(act), (), {"v": torch.zeros(obs.shape[:2])}


def row(n_envs):
    return (torch.zeros(1, n_envs, dtype=torch.int64),
            torch.zeros(1, n_envs, 4), torch.zeros(1, n_envs,
                                                   dtype=torch.int64),
            torch.zeros(1, n_envs), torch.ones(1, n_envs, dtype=torch.bool))


def test_the_local_policy_calls_the_actor_as_the_loops_did():
    from rlplay.engine.core.layout import State
    actor = Recording()
    policy = LocalPolicy(actor)
    state = State(*row(3))
    act, hx, info = policy.probe(state, None)
    assert act.shape == (1, 3) and hx == () and set(info) == {"v"}
    assert policy.initial_hx(state) == ()
    policy.step(state, ())
    policy.checked_step(state, (), state.act)
    assert set(policy.lookahead(state, ())) == {"v"}
    assert actor.calls == ["virtual", "virtual", "real", "real", "virtual"]
    with pytest.raises(ValueError, match="the actor returned an action of "
                                         "shape"):
        policy.checked_step(state, (), torch.zeros(1, 3, 2))
    with pytest.raises(TypeError):
        LocalPolicy(object())
