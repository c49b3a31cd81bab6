"""Exact values of the fragment layout (the table in ``rlplay.engine.core``).

The envs are ``CountingEnv`` (obs = steps since reset + 100 * episode index,
reward = action, terminating every ``term_every`` steps, truncated at
``trunc_at``), started without seeds so that the offset is 0. The actor
``Recorder`` acts ``(obs + stepno) % 5``, keeps in ``hx`` the number of
steps since its last reset and records in ``info`` what it saw.

The expected values come from literal tables worked out by hand from the
layout table, and from ``simulate``, an independent model of the same
rules run on many configurations.
"""
import numpy as np
import pytest
import torch

import rlplay.engine
from envs import (ENV_INFO, CountingEnv, CyclingEnv, EpisodeInfoEnv,
                  StructuredEnv)
from generators import CountingActor, assert_fragments_equal
from rlplay.engine import BaseActorModule, core
from rlplay.engine.core import (Fragment, acted, collect, env_axes,
                                episode_stats, prepare, startup)
from rlplay.engine.core.finals import obs_is_final
from rlplay.engine.nested import flatten, suply
from rlplay.engine.workers._batch import Collation
from rlplay.engine.returns import frozen


class Recorder(BaseActorModule):
    """act = (obs + stepno) % 5; hx, shape (1, B, 1), counts the steps
    since its last reset; ``resets`` logs the ``at`` of every reset."""

    def __init__(self):
        super().__init__()
        self.resets = []

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        if hx is None:
            hx = torch.full((1, obs.shape[1], 1), -7.0)  # reset() zeroes it
        x = obs[..., 0]
        info = {"obs": x.clone(), "stepno": stepno.clone(),
                "fin": fin.clone(), "hx": hx[..., 0].clone(),
                "virtual": torch.full_like(fin, virtual)}
        return (x.long() + stepno) % 5, hx + 1, info

    def reset(self, hx, at):
        self.resets.append(at.clone())
        return super().reset(hx, at)


def run(configs, n_steps, n_fragments, *, sticky=False, env_info=ENV_INFO,
        final=True, env_cls=CountingEnv, sparse_final=False, poison=None):
    """Collect fragments; return ``[(fragment copy, resets)]``.

    ``configs`` holds ``(term_every, trunc_at)`` per env; a tuple
    ``term_every`` gives the cycling episode lengths of a CyclingEnv.
    ``poison`` fills ``final`` before each fragment (to see which of its
    rows the loop writes).
    """
    envs = [CyclingEnv(k, trunc_at=n) if isinstance(k, tuple)
            else env_cls(term_every=k, trunc_at=n) for k, n in configs]
    actor = Recorder()
    buffer = prepare(envs[0], actor, n_steps, len(envs), env_info=env_info,
                     final=final)
    ctx = startup(envs, actor, buffer)
    actor.resets.clear()
    results = []
    for k in range(n_fragments):
        if poison is not None:
            for leaf in flatten(buffer.npy.final):
                leaf[1:] = poison  # row 0 is the last fragment's row T
        out = collect(actor, buffer, ctx, sticky=sticky, version=10 + k,
                      sparse_final=sparse_final)
        assert out is buffer
        results.append((suply(np.copy, buffer.npy),
                        [at.tolist() for at in actor.resets]))
        actor.resets.clear()
    return results


def columns(array):
    """``(1 + T, B, ...)`` to per-env lists of rows (first feature only)."""
    array = np.asarray(array)
    if array.ndim == 3:
        array = array[..., 0]
    return array.T.tolist()


def check_fragment(fragment, expected):
    """Compare every field listed in ``expected`` ({field: per-env rows})."""
    fields = {
        "obs": fragment.state.obs, "stepno": fragment.state.stepno,
        "act": fragment.state.act, "rew": fragment.state.rew,
        "fin": fragment.state.fin, "truncated": fragment.truncated,
        "final": fragment.final, "ret": fragment.stats.ret,
        "length": fragment.stats.length, "acted": fragment.acted,
        "env_t": fragment.env["t"], "mask_t": fragment.env_mask["t"],
        "env_done": fragment.env["done"],
        "mask_done": fragment.env_mask["done"],
    }
    for name, want in expected.items():
        got = columns(fields[name])
        assert got == want, f"{name}: got {got}, expected {want}"


# -- a worked example: T = 4, three envs ------------------------------------
#
# env 0: terminates every 2 steps: ends mid-fragment (row 2) and at row T,
#        so the next fragment starts with an end at row 0;
# env 1: truncated at 3 steps: ends at row T - 1;
# env 2: terminated and truncated at step 3 at once: terminated wins.

CONFIGS = [(2, None), (None, 3), (3, 3)]

FIRST = {
    "obs": [[0, 1, 100, 101, 200], [0, 1, 2, 100, 101], [0, 1, 2, 100, 101]],
    "stepno": [[0, 1, 0, 1, 0], [0, 1, 2, 0, 1], [0, 1, 2, 0, 1]],
    "act": [[0, 0, 2, 0, 2], [0, 0, 2, 4, 0], [0, 0, 2, 4, 0]],
    "rew": [[0, 0, 2, 0, 2], [0, 0, 2, 4, 0], [0, 0, 2, 4, 0]],
    "fin": [[1, 0, 1, 0, 1], [1, 0, 0, 1, 0], [1, 0, 0, 1, 0]],
    "truncated": [[0] * 5, [0, 0, 0, 1, 0], [0] * 5],
    "final": [[0, 1, 2, 101, 102], [0, 1, 2, 3, 101], [0, 1, 2, 3, 101]],
    "ret": [[0, 0, 2, 0, 2], [0, 0, 0, 6, 0], [0, 0, 0, 6, 0]],
    "length": [[0, 0, 2, 0, 2], [0, 0, 0, 3, 0], [0, 0, 0, 3, 0]],
    "env_t": [[1, 2, 1, 2], [1, 2, 3, 1], [1, 2, 3, 1]],
    "mask_t": [[1, 1, 1, 1]] * 3,
    "env_done": [[0, 1, 0, 1], [0, 0, 1, 0], [0, 0, 1, 0]],
    "mask_done": [[0, 1, 0, 1], [0, 0, 1, 0], [0, 0, 1, 0]],
}
FIRST_RESETS = [[True, False, False], [False, True, True],
                [True, False, False]]

SECOND = {
    "obs": [[200, 201, 300, 301, 400], [101, 102, 200, 201, 202],
            [101, 102, 200, 201, 202]],
    "stepno": [[0, 1, 0, 1, 0], [1, 2, 0, 1, 2], [1, 2, 0, 1, 2]],
    "act": [[2, 0, 2, 0, 2], [0, 2, 4, 0, 2], [0, 2, 4, 0, 2]],
    "rew": [[2, 0, 2, 0, 2], [0, 2, 4, 0, 2], [0, 2, 4, 0, 2]],
    "fin": [[1, 0, 1, 0, 1], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0]],
    "truncated": [[0] * 5, [0, 0, 1, 0, 0], [0] * 5],
    "final": [[102, 201, 202, 301, 302], [101, 102, 103, 201, 202],
              [101, 102, 103, 201, 202]],
    "ret": [[2, 0, 2, 0, 2], [0, 0, 6, 0, 0], [0, 0, 6, 0, 0]],
    "length": [[2, 0, 2, 0, 2], [0, 0, 3, 0, 0], [0, 0, 3, 0, 0]],
    "env_t": [[1, 2, 1, 2], [2, 3, 1, 2], [2, 3, 1, 2]],
    "mask_t": [[1, 1, 1, 1]] * 3,
    # zero where absent, although the reused buffer held 1.0 there before
    "env_done": [[0, 1, 0, 1], [0, 1, 0, 0], [0, 1, 0, 0]],
    "mask_done": [[0, 1, 0, 1], [0, 1, 0, 0], [0, 1, 0, 0]],
}
SECOND_RESETS = [[True, True, True], [True, False, False]]


@pytest.fixture(scope="module")
def worked():
    return run(CONFIGS, 4, 2)


def test_worked_example_first_fragment(worked):
    fragment, resets = worked[0]
    check_fragment(fragment, FIRST)
    assert resets == FIRST_RESETS


def test_worked_example_second_fragment(worked):
    fragment, resets = worked[1]
    check_fragment(fragment, SECOND)
    assert resets == SECOND_RESETS


def test_episode_ending_at_row_zero(worked):
    # env 0 ended at row T of the first fragment: row 0 of the second holds
    # that end (fin, the reset observation, the true final observation,
    # the statistics), but episode_stats counts it in the first only
    first, second = worked[0][0], worked[1][0]
    assert second.state.fin[0, 0] and second.state.obs[0, 0, 0] == 200
    assert second.final[0, 0, 0] == 102 and second.stats.ret[0, 0] == 2
    returns, lengths = episode_stats(first)
    assert returns.tolist() == [2, 6, 6, 2] and lengths.tolist() == \
        [2, 3, 3, 2]
    returns, lengths = episode_stats(second)
    assert returns.tolist() == [2, 6, 6, 2] and lengths.tolist() == \
        [2, 3, 3, 2]


def test_row_T_is_row_0_of_the_next_fragment(worked):
    (first, _), (second, _) = worked
    for a, b in zip(flatten((first.state, first.truncated, first.final,
                             first.stats)),
                    flatten((second.state, second.truncated, second.final,
                             second.stats))):
        np.testing.assert_array_equal(a[-1], b[0])


def test_actor_info_rows_and_lookahead(worked):
    for fragment, _ in worked:
        info = fragment.actor
        # row t of `actor` is what the actor computed on row t of `state`
        np.testing.assert_array_equal(info["obs"], fragment.state.obs[..., 0])
        np.testing.assert_array_equal(info["stepno"], fragment.state.stepno)
        np.testing.assert_array_equal(info["fin"], fragment.state.fin)
        # row T comes from the virtual lookahead, the others from real steps
        assert info["virtual"][:-1].sum() == 0 and info["virtual"][-1].all()


class Plain(BaseActorModule):
    """A feed-forward actor that records no info; counts its virtual
    calls."""

    def __init__(self):
        super().__init__()
        self.virtual = 0

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        self.virtual += virtual
        return torch.zeros_like(act), (), {}


def test_no_lookahead_call_for_an_actor_that_records_no_info():
    # the lookahead fills row T's info: an actor without one is not called
    # there (the Recorder, with info, is: the test above)
    envs = [CountingEnv(term_every=2, trunc_at=5) for _ in range(2)]
    actor = Plain()
    buffer = prepare(envs[0], actor, 4, 2)
    ctx = startup(envs, actor, buffer)
    before = actor.virtual  # the probe and the initial hx
    for _ in range(3):
        collect(actor, buffer, ctx)
    assert before > 0 and actor.virtual == before


def test_hx_is_reset_exactly_where_episodes_end(worked):
    # hx counts steps since its last reset: equal to stepno everywhere iff
    # it was reset at every episode end and nowhere else
    for fragment, resets in worked:
        np.testing.assert_array_equal(fragment.actor["hx"],
                                      fragment.state.stepno)
        ended = [row.tolist() for row in fragment.state.fin[1:] if row.any()]
        assert resets == ended


def test_hx_at_row_zero(worked):
    for fragment, _ in worked:
        assert fragment.hx.shape == (1, 3, 1)
        np.testing.assert_array_equal(fragment.hx[0, :, 0],
                                      fragment.state.stepno[0])
    assert worked[1][0].hx[0, :, 0].tolist() == [0, 1, 1]


def test_meta(worked):
    for k, (fragment, _) in enumerate(worked):
        assert fragment.meta.version.tolist() == [10 + k] * 3
        assert fragment.meta.seq.tolist() == [k] * 3
        assert fragment.meta.worker.tolist() == [0] * 3
        assert fragment.meta.env.tolist() == [0, 1, 2]


def test_meta_worker_and_env_ids():
    envs = [CountingEnv(), CountingEnv()]
    actor = Recorder()
    buffer = prepare(envs[0], actor, 2, 2)
    ctx = startup(envs, actor, buffer, worker=3, env_ids=[6, 7])
    collect(actor, buffer, ctx)
    assert buffer.npy.meta.worker.tolist() == [3, 3]
    assert buffer.npy.meta.env.tolist() == [6, 7]
    assert buffer.npy.meta.version.tolist() == [0, 0]


def test_first_row_of_the_first_fragment(worked):
    fragment = worked[0][0]
    assert fragment.state.fin[0].all() and not fragment.truncated[0].any()
    assert not fragment.state.act[0].any() and not fragment.state.rew[0].any()
    assert not fragment.state.stepno[0].any()
    np.testing.assert_array_equal(fragment.final[0], fragment.state.obs[0])
    assert not fragment.stats.ret[0].any()


def test_dtypes_and_shapes(worked):
    fragment = worked[0][0]
    assert isinstance(fragment, Fragment)
    T1, B = 5, 3
    assert fragment.state.stepno.shape == (T1, B)
    assert fragment.state.stepno.dtype == np.int64
    assert fragment.state.obs.shape == (T1, B, 1)
    assert fragment.state.obs.dtype == np.float32
    assert fragment.state.act.dtype == np.int64
    assert fragment.state.rew.dtype == np.float32
    assert fragment.state.fin.dtype == bool
    assert fragment.truncated.dtype == bool
    assert fragment.final.shape == (T1, B, 1)
    assert fragment.env["t"].shape == (T1 - 1, B)
    assert fragment.env["t"].dtype == np.int64
    assert fragment.env["done"].dtype == np.float32
    assert fragment.env_mask["done"].dtype == bool
    assert fragment.stats.ret.dtype == np.float64
    assert fragment.stats.length.dtype == np.int64
    assert fragment.meta.version.shape == (B,)
    assert fragment.actor["virtual"].dtype == bool


def test_torch_and_numpy_views_are_one_memory():
    envs = [CountingEnv(term_every=2)]
    actor = Recorder()
    buffer = prepare(envs[0], actor, 3, 1, env_info=ENV_INFO)
    collect(actor, buffer, startup(envs, actor, buffer))
    for array, tensor in zip(flatten(buffer.npy), flatten(buffer.pyt)):
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_array_equal(array, tensor.numpy())
        assert array.ctypes.data == tensor.data_ptr()


# -- sticky ------------------------------------------------------------------

STICKY_FIRST = {
    "obs": [[0, 1, 100, 100, 100], [0, 1, 2, 100, 100], [0, 1, 2, 100, 100]],
    "stepno": [[0, 1, 0, 0, 0], [0, 1, 2, 0, 0], [0, 1, 2, 0, 0]],
    "act": [[0, 0, 2, 2, 2], [0, 0, 2, 4, 4], [0, 0, 2, 4, 4]],
    "rew": [[0, 0, 2, 0, 0], [0, 0, 2, 4, 0], [0, 0, 2, 4, 0]],
    "fin": [[1, 0, 1, 1, 1], [1, 0, 0, 1, 1], [1, 0, 0, 1, 1]],
    "truncated": [[0] * 5, [0, 0, 0, 1, 0], [0] * 5],
    "final": [[0, 1, 2, 2, 2], [0, 1, 2, 3, 3], [0, 1, 2, 3, 3]],
    "ret": [[0, 0, 2, 0, 0], [0, 0, 0, 6, 0], [0, 0, 0, 6, 0]],
    "length": [[0, 0, 2, 0, 0], [0, 0, 0, 3, 0], [0, 0, 0, 3, 0]],
    "env_t": [[1, 2, 0, 0], [1, 2, 3, 0], [1, 2, 3, 0]],
    "mask_t": [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]],
    "env_done": [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0]],
    "mask_done": [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0]],
}
STICKY_FIRST_RESETS = [[True, False, False], [True, True, True],
                       [True, True, True]]

STICKY_SECOND = {
    "obs": [[100, 101, 200, 200, 200], [100, 101, 102, 200, 200],
            [100, 101, 102, 200, 200]],
    "stepno": [[0, 1, 0, 0, 0], [0, 1, 2, 0, 0], [0, 1, 2, 0, 0]],
    "act": [[2, 0, 2, 2, 2], [4, 0, 2, 4, 4], [4, 0, 2, 4, 4]],
    "rew": [[0, 0, 2, 0, 0], [0, 0, 2, 4, 0], [0, 0, 2, 4, 0]],
    "fin": [[1, 0, 1, 1, 1], [1, 0, 0, 1, 1], [1, 0, 0, 1, 1]],
    "truncated": [[0] * 5, [0, 0, 0, 1, 0], [0] * 5],
    "final": [[2, 101, 102, 102, 102], [3, 101, 102, 103, 103],
              [3, 101, 102, 103, 103]],
    "ret": [[0, 0, 2, 0, 0], [0, 0, 0, 6, 0], [0, 0, 0, 6, 0]],
    "length": [[0, 0, 2, 0, 0], [0, 0, 0, 3, 0], [0, 0, 0, 3, 0]],
}


@pytest.fixture(scope="module")
def sticky():
    return run(CONFIGS, 4, 2, sticky=True)


def test_sticky_first_fragment(sticky):
    fragment, resets = sticky[0]
    check_fragment(fragment, STICKY_FIRST)
    assert resets == STICKY_FIRST_RESETS


def test_sticky_second_fragment_carries_on_from_the_reset(sticky):
    fragment, _ = sticky[1]
    check_fragment(fragment, STICKY_SECOND)
    np.testing.assert_array_equal(fragment.state.obs[0],
                                  sticky[0][0].state.obs[-1])


def test_sticky_frozen_rows_and_actor(sticky):
    for fragment, resets in sticky:
        # the actor saw the frozen rows, and its hx was reset at each one
        np.testing.assert_array_equal(fragment.actor["obs"],
                                      fragment.state.obs[..., 0])
        np.testing.assert_array_equal(fragment.actor["hx"],
                                      fragment.state.stepno)
        assert resets == [row.tolist() for row in fragment.state.fin[1:]
                          if row.any()]
    returns, lengths = episode_stats(sticky[0][0])
    assert returns.tolist() == [2, 6, 6] and lengths.tolist() == [2, 3, 3]


def test_sticky_off_steps_through(worked, sticky):
    # the same first two rows either way; only sticky freezes after an end
    for name in ("obs", "act", "rew"):
        a = getattr(worked[0][0].state, name)[:3, 0]
        b = getattr(sticky[0][0].state, name)[:3, 0]
        np.testing.assert_array_equal(a, b)
    assert worked[0][0].state.obs[3, 0, 0] == 101
    assert sticky[0][0].state.obs[3, 0, 0] == 100


# -- an independent model on many configurations ------------------------------

def simulate(configs, n_steps, n_fragments, sticky=False):
    """The expected fragments, from the layout table, per env and row."""
    n_envs, T = len(configs), n_steps
    counters = [{"t": 0, "ep": 0} for _ in configs]
    zero = {"stepno": 0, "obs": 0, "act": 0, "rew": 0, "fin": 1,
            "truncated": 0, "final": 0, "ret": 0, "length": 0, "acted": 0}
    last = [dict(zero) for _ in configs]
    running = [[0, 0] for _ in configs]
    hx = [0] * n_envs
    fragments = []
    for _ in range(n_fragments):
        # row 0 repeats row T of the previous fragment, and is no transition
        rows = [[dict(row, acted=0) for row in last]]
        env = {name: [[0] * T for _ in configs]
               for name in ("env_t", "mask_t", "env_done", "mask_done")}
        hx_rows = [[0] * (T + 1) for _ in configs]
        resets, frozen = [], [False] * n_envs
        for t in range(T):
            new = []
            for j, (term_every, trunc_at) in enumerate(configs):
                row = rows[t][j]
                hx_rows[j][t] = hx[j]
                hx[j] += 1
                if frozen[j]:
                    new.append(dict(row, rew=0, truncated=0, ret=0, length=0,
                                    fin=1, acted=0))
                    continue
                action = (row["obs"] + row["stepno"]) % 5
                c = counters[j]
                c["t"] += 1
                obs = c["t"] + 100 * c["ep"]
                if isinstance(term_every, tuple):  # cycling lengths
                    term = c["t"] == term_every[c["ep"] % len(term_every)]
                else:
                    term = term_every is not None and \
                        c["t"] % term_every == 0
                trunc = trunc_at is not None and c["t"] >= trunc_at
                running[j][0] += action
                running[j][1] += 1
                env["env_t"][j][t], env["mask_t"][j][t] = c["t"], 1
                if term or trunc:
                    env["env_done"][j][t], env["mask_done"][j][t] = 1, 1
                    c["t"], c["ep"] = 0, c["ep"] + 1
                    new.append({"stepno": 0, "obs": 100 * c["ep"],
                                "act": action, "rew": action, "fin": 1,
                                "truncated": int(trunc and not term),
                                "final": obs, "ret": running[j][0],
                                "length": running[j][1], "acted": 1})
                    running[j] = [0, 0]
                    frozen[j] = sticky
                else:
                    new.append({"stepno": row["stepno"] + 1, "obs": obs,
                                "act": action, "rew": action, "fin": 0,
                                "truncated": 0, "final": obs, "ret": 0,
                                "length": 0, "acted": 1})
            ended = [bool(r["fin"]) for r in new]
            for j in range(n_envs):
                if ended[j]:
                    hx[j] = 0
            if any(ended):
                resets.append(ended)
            rows.append(new)
        for j in range(n_envs):
            hx_rows[j][T] = hx[j]
        expected = {name: [[rows[t][j][name] for t in range(T + 1)]
                           for j in range(n_envs)] for name in zero}
        expected.update(env)
        fragments.append((expected, hx_rows, resets))
        last = rows[T]
    return fragments


MODEL_CASES = [
    ([(2, None), (None, 3), (3, 3)], 4),
    ([(1, None), (None, 1), (5, 2), (2, 5)], 3),
    ([(3, None), (4, 6), (None, None), (7, 4)], 5),
    ([(2, 2), (6, None)], 1),
    ([(4, None), (None, 5), (3, 9)], 6),
    # episode ends fall on different rows from fragment to fragment, so
    # that frozen (sticky) rows land where the reused buffer held an end
    ([((1, 3), None), ((2, 1, 4), 3), ((3, 5, 1), 4)], 3),
    ([((4, 1, 2), None), ((2, 6), 5)], 4),
]


@pytest.mark.parametrize("by_rows", [False, True], ids=["masked", "by_rows"])
@pytest.mark.parametrize("sticky_", [False, True], ids=["plain", "sticky"])
@pytest.mark.parametrize("configs, n_steps", MODEL_CASES)
def test_fragments_match_the_model(configs, n_steps, sticky_, by_rows,
                                   monkeypatch):
    """Every field of every fragment as the model says; ``final`` filled
    either way (small observations by a masked copy, large ones row by
    row)."""
    if by_rows:
        monkeypatch.setattr(core.finals, "FILL_BY_ROWS", 0)
    n_fragments = 6
    got = run(configs, n_steps, n_fragments, sticky=sticky_)
    want = simulate(configs, n_steps, n_fragments, sticky=sticky_)
    for k, ((fragment, resets), (expected, hx_rows, ended)) in enumerate(
            zip(got, want)):
        check_fragment(fragment, expected)
        assert columns(fragment.actor["hx"]) == hx_rows, k
        assert resets == ended, k
        assert fragment.hx[0, :, 0].tolist() == [h[0] for h in hx_rows]


@pytest.mark.parametrize("shape, dtype", [
    ((), np.float32), ((4,), np.float32), ((2, 3), np.uint8),
    ((17,), np.float64), ((16, 16, 4), np.uint8)])
@pytest.mark.parametrize("strided", [False, True])
def test_copy_obs_to_final_is_a_masked_copy(shape, dtype, strided):
    """final[keep] = obs[keep], for each path of the copy: scalars, small
    observations (a void view of each env's), large ones (row by row),
    and trailing axes that are not contiguous."""
    from rlplay.engine.core.finals import copy_obs_to_final
    rng = np.random.default_rng(0)
    T, B = 6, 5
    trailing = (*shape[:-1], 2 * shape[-1]) if strided and shape else shape
    obs = rng.integers(1, 100, (T, B, *trailing)).astype(dtype)
    if strided and shape:
        obs = obs[..., ::2]
    final = np.zeros((T, B, *shape), dtype)
    keep = rng.random((T, B)) < 0.6
    want = final.copy()
    want[keep] = obs[keep]
    copy_obs_to_final(final, obs, keep)
    np.testing.assert_array_equal(final, want)


@pytest.mark.parametrize("sticky_", [False, True], ids=["plain", "sticky"])
@pytest.mark.parametrize("configs, n_steps", MODEL_CASES)
def test_sparse_final_leaves_the_copies_of_obs_to_the_collation(
        configs, n_steps, sticky_):
    """With ``sparse_final``, the loop writes ``final`` only where an
    episode ended and in row ``T`` (the next row 0), each such value as
    the dense fragment holds it; the learner's collation of the sparse
    fragment is the dense fragment, every leaf."""
    dense = run(configs, n_steps, 6, sticky=sticky_)
    sparse = run(configs, n_steps, 6, sticky=sticky_, sparse_final=True,
                 poison=-1.0)
    T = n_steps
    for k, ((want, _), (got, _)) in enumerate(zip(dense, sparse)):
        keep = obs_is_final(want.state.fin[1:], want.acted[1:], sticky_)
        assert (got.final[1:T][keep[:-1]] == -1.0).all(), k  # unwritten
        assert np.array_equal(got.final[1:][~keep], want.final[1:][~keep])
        assert np.array_equal(got.final[[0, T]], want.final[[0, T]]), k
        assert_fragments_equal(
            suply(torch.from_numpy, got._replace(final=want.final)),
            suply(torch.from_numpy, want))
        collation = Collation(suply(torch.from_numpy, got), 1, 1,
                              sticky=sticky_)
        host, _ = collation.collate([Collation.sources(got)])
        assert_fragments_equal(host, suply(torch.from_numpy, want))


def test_the_model_agrees_with_the_worked_example():
    (first, _, first_resets), (second, _, second_resets) = simulate(
        CONFIGS, 4, 2)
    for name, rows in FIRST.items():
        assert first[name] == rows, name
    for name, rows in SECOND.items():
        assert second[name] == rows, name
    assert first_resets == FIRST_RESETS and second_resets == SECOND_RESETS
    (sticky_first, _, sticky_resets), (sticky_second, _, _) = simulate(
        CONFIGS, 4, 2, sticky=True)
    for name, rows in STICKY_FIRST.items():
        assert sticky_first[name] == rows, name
    for name, rows in STICKY_SECOND.items():
        assert sticky_second[name] == rows, name
    assert sticky_resets == STICKY_FIRST_RESETS


# -- env axes, columns, acted rows -------------------------------------------

def collected(actor, n_steps=4, n_envs=3, final=True, sticky=False):
    """One fragment of CountingEnvs (env ids 10, 11, ...), as the buffer
    holds it: ``(npy, pyt)`` views of one memory."""
    envs = [CountingEnv(term_every=2 + j) for j in range(n_envs)]
    buffer = prepare(envs[0], actor, n_steps, n_envs, env_info=ENV_INFO,
                     final=final)
    ctx = startup(envs, actor, buffer, env_ids=np.arange(10, 10 + n_envs))
    collect(actor, buffer, ctx, sticky=sticky)
    return buffer


def test_env_axes():
    axes = env_axes()
    assert isinstance(axes, Fragment)
    assert axes == Fragment(state=1, truncated=1, final=1, actor=1, env=1,
                            env_mask=1, hx=1, stats=1, meta=0, acted=1)
    assert env_axes(0) == axes._replace(hx=0)
    assert env_axes(2) == axes._replace(hx=2)


@pytest.mark.parametrize("actor_cls", [Recorder, CountingActor])
def test_env_axes_are_the_env_columns_of_a_fragment(actor_cls):
    """Along its env axis (``hx``: the actor's ``hx_dim``), every leaf of
    a fragment of B envs has size B (T = 4, 1 + T = 5, B = 3: no other
    axis has that size)."""
    actor = actor_cls()
    fragment = collected(actor).npy
    for field, axis in zip(fragment, env_axes(actor.hx_dim)):
        for leaf in flatten(field):
            assert leaf.shape[axis] == 3, (leaf.shape, axis)


def expected_columns(fragment, index, hx_dim):
    """``index`` along each field's env axis, leaf by leaf (numpy)."""
    def take(leaf, axis):
        leaf = np.asarray(leaf)
        if isinstance(index, slice):
            return leaf[(slice(None),) * axis + (index,)]
        return np.take(leaf, index, axis=axis)

    return [None if field is None else [take(leaf, axis)
                                        for leaf in flatten(field)]
            for field, axis in zip(fragment, env_axes(hx_dim))]


def leaf_memory(leaf):
    return leaf.data_ptr() if isinstance(leaf, torch.Tensor) else \
        leaf.__array_interface__["data"][0]


@pytest.mark.parametrize("view", ["npy", "pyt"])
@pytest.mark.parametrize("index", [slice(1, 3), [2, 0]],
                         ids=["slice", "list"])
@pytest.mark.parametrize("actor_cls", [Recorder, CountingActor])
def test_columns(actor_cls, index, view):
    """The env columns ``index`` of a numpy or torch fragment: every
    field along its env axis, ``hx`` along ``hx_dim`` (1 for Recorder's
    ``(1, B, 1)``, 0 for CountingActor's ``(B, 2)``), ``meta`` along axis
    0; views of the fragment for a slice; ``None`` fields stay ``None``."""
    actor = actor_cls()
    buffer = collected(actor, final=False)
    fragment = getattr(buffer, view)
    got = core.columns(fragment, index, actor.hx_dim)
    assert isinstance(got, Fragment) and got.final is None
    kind = type(fragment.state.obs)
    for field, want in zip(got, expected_columns(fragment, index,
                                                 actor.hx_dim)):
        if want is None:
            assert field is None
            continue
        leaves = flatten(field)
        assert len(leaves) == len(want)
        for leaf, expected in zip(leaves, want):
            assert type(leaf) is kind
            np.testing.assert_array_equal(np.asarray(leaf), expected)
    assert np.asarray(got.meta.env).tolist() == \
        (np.arange(10, 13)[index]).tolist()
    hx_shape = (1, 2, 1) if actor.hx_dim == 1 else (2, 2)
    assert tuple(got.hx.shape) == hx_shape
    assert got.state.obs.shape == (5, 2, 1) and got.env["t"].shape == (4, 2)
    # a slice gives views: a write shows in the fragment
    got.state.rew[1, 0] = 42.0
    j = index.start if isinstance(index, slice) else None
    if j is not None:
        assert fragment.state.rew[1, j] == 42.0
        assert leaf_memory(got.meta.env) == leaf_memory(fragment.meta.env[j:])
    else:
        assert not (np.asarray(fragment.state.rew) == 42.0).any()


def sticky_and_plain_fragments():
    """Every fragment of the model's cases, sticky and not."""
    for configs, n_steps in MODEL_CASES:
        for sticky_ in (False, True):
            for fragment, _ in run(configs, n_steps, 6, sticky=sticky_):
                yield sticky_, fragment


def as_torch(fragment):
    return suply(torch.as_tensor, fragment)


def test_acted_rows():
    """Row 0 never; on a sticky fragment, rows ``1..T`` but the frozen
    ones (``~frozen(fin)``); on a non-sticky fragment, all of rows
    ``1..T``; numpy in, numpy out, torch in, torch out."""
    n_sticky = n_frozen = 0
    for sticky_, fragment in sticky_and_plain_fragments():
        mask = acted(fragment)
        assert isinstance(mask, np.ndarray) and mask.dtype == bool
        assert mask.shape == fragment.state.fin.shape
        assert not mask[0].any()
        if sticky_:
            live = ~frozen(fragment.state.fin)
            np.testing.assert_array_equal(mask[1:], live[1:].numpy())
            n_sticky += 1
            n_frozen += int((~live[1:]).sum())
        else:
            assert mask[1:].all()
        tensor = acted(as_torch(fragment))
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_array_equal(tensor.numpy(), mask)
    assert n_sticky and n_frozen  # frozen rows were there to leave out


# where episodes start and end, by env (rows 0..T of the first fragment of
# the worked example, plain and sticky)
EDGES = {
    "starts": [[1, 0, 1, 0, 1], [1, 0, 0, 1, 0], [1, 0, 0, 1, 0]],
    "ends": [[0, 0, 1, 0, 1], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0]],
    "terminated": [[0, 0, 1, 0, 1], [0] * 5, [0, 0, 0, 1, 0]],
    "truncated": [[0] * 5, [0, 0, 0, 1, 0], [0] * 5],
}
# sticky: a frozen row starts nothing (row T, the reset observation the
# next fragment goes on from, does)
STICKY_EDGES = {
    "starts": [[1, 0, 0, 0, 1], [1, 0, 0, 0, 1], [1, 0, 0, 0, 1]],
    "ends": [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0]],
    "terminated": [[0, 0, 1, 0, 0], [0] * 5, [0, 0, 0, 1, 0]],
    "truncated": [[0] * 5, [0, 0, 0, 1, 0], [0] * 5],
}


@pytest.mark.parametrize("kind", ["plain", "sticky"])
def test_episode_edges(worked, sticky, kind):
    fragment = (worked if kind == "plain" else sticky)[0][0]
    want = EDGES if kind == "plain" else STICKY_EDGES
    for views in (fragment, as_torch(fragment)):
        edges = core.episode_edges(views)
        assert isinstance(edges, core.EpisodeEdges)
        for name, rows in want.items():
            got = getattr(edges, name)
            assert type(got) is type(views.state.fin)
            assert columns(got) == rows, name
    # the fragment is left as it was
    check_fragment(fragment, FIRST if kind == "plain" else STICKY_FIRST)


def test_acted_needs_the_field(worked):
    fragment = worked[0][0]._replace(acted=None)
    with pytest.raises(ValueError, match="no acted field"):
        acted(fragment)


def episode_stats_before(fragment):
    """``episode_stats`` before it followed :func:`acted`: the returns and
    lengths of rows ``1..T`` with a length (the frozen rows of a sticky
    fragment have none)."""
    ret, length = fragment.stats
    ret, length = np.asarray(ret[1:]), np.asarray(length[1:])
    ended = length > 0
    return ret[ended], length[ended]


def test_episode_stats_as_before():
    """On sticky fragments (and plain ones), the returns and lengths of
    the episodes that ended at acted rows, as before, in row-major order;
    from numpy or torch fragments."""
    n_ends = 0
    for sticky_, fragment in sticky_and_plain_fragments():
        want_returns, want_lengths = episode_stats_before(fragment)
        for views in (fragment, as_torch(fragment)):
            returns, lengths = rlplay.engine.episode_stats(views)
            assert returns.dtype == np.float64 and lengths.dtype == np.int64
            np.testing.assert_array_equal(returns, want_returns)
            np.testing.assert_array_equal(lengths, want_lengths)
        # the ends at acted rows, spelled out
        ended = acted(fragment) & fragment.state.fin
        np.testing.assert_array_equal(want_lengths,
                                      fragment.stats.length[ended])
        n_ends += sticky_ * len(want_lengths)
    assert n_ends > 0


# -- options -----------------------------------------------------------------

def test_without_final_observations_and_env_info():
    fragment, _ = run([(2, None)], 3, 1, env_info=None, final=False)[0]
    assert fragment.final is None
    assert fragment.env == {} and fragment.env_mask == {}
    assert columns(fragment.state.obs) == [[0, 1, 100, 101]]


def test_nested_env_info_present_only_at_episode_ends():
    spec = {"episode": {"r": 0.0, "l": 0}}
    (first, _), (second, _) = run([(2, None), (None, 3)], 3, 2,
                                  env_info=spec, env_cls=EpisodeInfoEnv)
    # env 0: rewards 0, 2 then ends; env 1: rewards 0, 2, 4 then ends
    assert set(first.env) == {"episode"}
    assert first.env_mask["episode"].T.tolist() == [[0, 1, 0], [0, 0, 1]]
    assert first.env["episode"]["r"].T.tolist() == [[0, 2, 0], [0, 0, 6]]
    assert first.env["episode"]["l"].T.tolist() == [[0, 2, 0], [0, 0, 3]]
    assert first.env["episode"]["l"].dtype == np.int64
    assert second.env_mask["episode"].T.tolist() == [[1, 0, 1], [0, 0, 1]]
    assert second.env["episode"]["r"].T.tolist() == [[2, 0, 2], [0, 0, 6]]
    assert second.env["episode"]["l"].T.tolist() == [[2, 0, 2], [0, 0, 3]]


# -- Dict observations and Tuple actions -------------------------------------

class StructuredActor(BaseActorModule):
    """Action (stepno % 3, [0.25, 0.5] * (pos[0] + 1)); reward therefore
    ``stepno % 3 + 0.75 * (t + 1)`` while the Box action stays within
    its bounds of +-1 (the env gets it clipped there)."""

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        scale = obs["pos"][..., :1] + 1
        a1 = torch.tensor([0.25, 0.5]) * scale
        return (stepno % 3, a1), (), {"flag": obs["flag"].clone()}

    def reset(self, hx, at):
        return hx


def test_dict_observations_and_tuple_actions():
    envs = [StructuredEnv(term_every=4), StructuredEnv(term_every=2)]
    actor = StructuredActor()
    buffer = prepare(envs[0], actor, 5, 2)
    ctx = startup(envs, actor, buffer)
    collect(actor, buffer, ctx)
    npy = buffer.npy
    obs, act = npy.state.obs, npy.state.act
    assert set(obs) == {"pos", "flag", "pair"}
    assert obs["flag"].dtype == np.int64 and obs["pair"][1].dtype == np.int8
    assert act[0].dtype == np.int64 and act[1].shape == (6, 2, 2)
    assert act[1].dtype == np.float32
    assert npy.hx == ()
    # env 0 counts t = 0 1 2 3 | 0 1, ending at row 4
    assert obs["pos"][:, 0].tolist() == [[0, 0], [1, -1], [2, -2], [3, -3],
                                         [0, 0], [1, -1]]
    assert obs["flag"][:, 0].tolist() == [0, 1, 0, 1, 0, 1]
    assert obs["pair"][0][:, 0].tolist() == [[0, 0], [1, 1], [2, 2], [0, 3],
                                             [0, 0], [1, 1]]
    assert obs["pair"][1][:, 0].tolist() == [[0, 0, 0], [1, 0, 0], [0, 1, 0],
                                             [1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert npy.state.fin[:, 0].tolist() == [1, 0, 0, 0, 1, 0]
    # the true final observation of the episode that ended at row 4 (t = 4)
    final = npy.final
    assert final["pos"][4, 0].tolist() == [4, -4]
    assert final["flag"][4, 0] == 0
    assert final["pair"][0][4, 0].tolist() == [1, 0]
    assert final["pair"][1][4, 0].tolist() == [0, 0, 1]
    assert final["pos"][3, 0].tolist() == [3, -3]  # elsewhere, obs itself
    # actions: a0 = stepno % 3 of the row before, a1 = [.25, .5] (t + 1)
    # as the actor chose them; the env executes them clipped into its
    # Box(-1, 1), and the rewards are those of what it executed
    assert act[0][:, 0].tolist() == [0, 0, 1, 2, 0, 0]
    assert act[1][:, 0].tolist() == [[0, 0], [0.25, 0.5], [0.5, 1.0],
                                     [0.75, 1.5], [1.0, 2.0], [0.25, 0.5]]
    assert npy.state.rew[:, 0].tolist() == [0, 0.75, 2.5, 3.75, 2.0, 0.75]
    # env 1 ends at rows 2 and 4
    assert npy.state.fin[:, 1].tolist() == [1, 0, 1, 0, 1, 0]
    assert final["pos"][2, 1].tolist() == [2, -2]
    assert obs["pos"][2, 1].tolist() == [0, 0]
    np.testing.assert_array_equal(npy.actor["flag"], obs["flag"])


def test_dict_observations_sticky():
    envs = [StructuredEnv(term_every=2)]
    actor = StructuredActor()
    buffer = prepare(envs[0], actor, 4, 1)
    collect(actor, buffer, startup(envs, actor, buffer), sticky=True)
    npy = buffer.npy
    assert npy.state.obs["pos"][:, 0, 0].tolist() == [0, 1, 0, 0, 0]
    assert npy.final["pos"][:, 0, 0].tolist() == [0, 1, 2, 2, 2]
    assert npy.final["pair"][1][:, 0].tolist() == [[0, 0, 0], [1, 0, 0],
                                                   [0, 1, 0], [0, 1, 0],
                                                   [0, 1, 0]]
    assert npy.state.act[1][:, 0].tolist() == [[0, 0], [0.25, 0.5],
                                               [0.5, 1.0], [0.5, 1.0],
                                               [0.5, 1.0]]
    assert npy.state.rew[:, 0].tolist() == [0, 0.75, 2.5, 0, 0]


# -- whole episodes ----------------------------------------------------------

def test_evaluate_plays_whole_episodes():
    from rlplay.engine.core import episode, evaluate

    # every episode of CountingEnv(term_every=3) under Recorder: actions
    # 0, 2, 4 (obs + stepno = 100 k + 2 t), so return 6 in 3 steps
    envs = [CountingEnv(term_every=3), CountingEnv(term_every=3)]
    returns, lengths = evaluate(envs, Recorder(), 3)
    assert returns.tolist() == [6.0, 6.0, 6.0]
    assert lengths.tolist() == [3, 3, 3]
    assert returns.dtype == np.float64 and lengths.dtype == np.int64
    # each env plays ceil(3 / 2) = 2 episodes
    assert [env.n_episodes for env in envs] == [1, 1]
    # a time limit counts as the end of an episode: actions 0, 2
    returns, lengths = evaluate([CountingEnv()], Recorder(), 2, max_steps=2)
    assert returns.tolist() == [2.0, 2.0] and lengths.tolist() == [2, 2]
    assert episode(CountingEnv(trunc_at=4), Recorder()) == (0 + 2 + 4 + 1, 4)


def test_evaluate_handles_dict_observations_and_tuple_actions():
    from rlplay.engine.core import evaluate

    # StructuredActor's reward at step t is t % 3 + 0.75 (t + 1) with its
    # Box action clipped into +-1: over an episode of 4 steps 0.75 + 2.5 +
    # 3.75 + 2.0 (as collect, evaluate clips)
    envs = [StructuredEnv(term_every=4), StructuredEnv(term_every=4)]
    returns, lengths = evaluate(envs, StructuredActor(), 4)
    assert lengths.tolist() == [4, 4, 4, 4]
    assert returns.tolist() == [9.0, 9.0, 9.0, 9.0]


# -- what the env gets as its action ------------------------------------------

class Outside(BaseActorModule):
    """Box actions ``[2 + k, -2 - k]`` at its ``k``-th real step (outside
    the [-1, 1] that InPlaceEnv clips them into in place, itself); with
    ``nested=True`` inside a ``(Discrete(2), Box)`` tuple."""

    def __init__(self, nested=False):
        super().__init__()
        self.nested, self.k = nested, 0

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        n_envs = fin.shape[1]
        box = torch.tensor([2.0 + self.k, -2.0 - self.k]).expand(
            1, n_envs, 2).clone()
        self.k += not virtual
        if self.nested:
            return (torch.zeros(1, n_envs, dtype=torch.int64), box), (), {}
        return box, (), {}

    def reset(self, hx, at):
        return ()


@pytest.mark.parametrize("nested", [False, True], ids=["box", "tuple"])
def test_an_env_that_clips_its_action_in_place_leaves_the_record(nested):
    from envs import InPlaceEnv

    envs = [InPlaceEnv(nested), InPlaceEnv(nested)]
    actor = Outside(nested)
    buffer = prepare(envs[0], actor, 3, 2)
    collect(actor, buffer, startup(envs, actor, buffer))
    act = buffer.npy.state.act[1] if nested else buffer.npy.state.act
    # the actor's actions, not the env's clipped copies
    assert act[1:, 0].tolist() == [[2, -2], [3, -3], [4, -4]]
    assert act[1:, 1].tolist() == act[1:, 0].tolist()
    assert [a.tolist() for a in envs[1].seen] == [[2, -2], [3, -3], [4, -4]]
    assert buffer.npy.state.rew[1:].tolist() == [[0, 0]] * 3  # clipped


@pytest.mark.parametrize("nested", [False, True], ids=["box", "tuple"])
def test_an_env_that_keeps_its_actions_sees_them_unchanged(nested):
    from envs import InPlaceEnv

    envs = [InPlaceEnv(nested, clip=False), InPlaceEnv(nested, clip=False)]
    actor = Outside(nested)
    buffer = prepare(envs[0], actor, 2, 2)
    ctx = startup(envs, actor, buffer)
    for _ in range(3):  # the buffer is reused twice
        collect(actor, buffer, ctx)
    for env in envs:
        # what it kept still holds what it got, after the buffer moved on
        assert [a.tolist() for a in env.kept] == [
            [2 + k, -2 - k] for k in range(6)]
        assert [a.tolist() for a in env.seen] == [
            [2 + k, -2 - k] for k in range(6)]
    # and editing one env's action touches neither another env's nor the
    # record
    envs[0].kept[-1][:] = 0
    assert envs[1].kept[-1].tolist() == [7, -7]
    act = buffer.npy.state.act[1] if nested else buffer.npy.state.act
    assert act[-1].tolist() == [[7, -7], [7, -7]]


# -- the action of rows that no action led to ----------------------------------

class Echo(BaseActorModule):
    """Acts ``act`` (the action it was shown), records what it saw."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def step(self, stepno, obs, act, rew, fin, /, *, hx, virtual):
        self.seen.append((virtual, suply(torch.clone, act)))
        return suply(torch.clone, act), (), {}

    def reset(self, hx, at):
        return ()


def placeholder_env(term_every=None):
    from gymnasium import spaces

    from envs import SpacesEnv

    action_space = spaces.Tuple((
        spaces.Discrete(3, start=1),
        spaces.Box(1.0, 2.0, (2,), np.float32),
        spaces.Box(np.float32([-np.inf, -5, -1]), np.float32([-3, np.inf, 1])),
        spaces.MultiDiscrete([2, 3], start=[1, -1]),
        spaces.MultiBinary(2)))
    return SpacesEnv(spaces.Box(-1.0, 1.0, (1,), np.float32), action_space,
                     lambda episode, t: np.zeros(1, np.float32),
                     term_every=term_every)


PLACEHOLDER = [1, [1.0, 1.0], [-3.0, 0.0, 0.0], [1, 0], [0, 0]]


def as_lists(act, j=0):
    return [np.asarray(leaf)[j].tolist() for leaf in act]


def test_row_zero_records_a_valid_placeholder_action():
    envs = [placeholder_env(), placeholder_env()]
    actor = Echo()
    buffer = prepare(envs[0], actor, 2, 2)
    # the probes saw the placeholder, not zeros outside the space
    assert [as_lists(act, (0, 1)) for _, act in actor.seen] == \
        [PLACEHOLDER] * len(actor.seen)
    ctx = startup(envs, actor, buffer)
    assert as_lists(ctx.last[0].act, 1) == PLACEHOLDER
    collect(actor, buffer, ctx)
    act = buffer.npy.state.act
    for t in range(3):  # the Echo actor repeats it, valid everywhere
        assert as_lists([leaf[t] for leaf in act], 1) == PLACEHOLDER
    assert envs[0].actions[0][0] == 1


def test_evaluate_starts_from_the_placeholder_action():
    from rlplay.engine.core import evaluate

    actor = Echo()
    evaluate([placeholder_env(term_every=2)], actor, 1)
    virtual, first = actor.seen[1]  # after the virtual probe of _initial_hx
    assert not virtual and as_lists(first, (0, 0)) == PLACEHOLDER
