"""V-trace against a brute-force reference written from the IMPALA paper's
definition (per env, per row, plain loops), against GAE on-policy, and
against TorchRL's ``vtrace_advantage_estimate``."""
import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from envs import CountingEnv
from rlplay.engine import PolicyActor, acted
from rlplay.engine.returns import VTrace, gae, returns, vtrace
from rlplay.engine.rollout import same

INF = math.inf
# the layouts of a column: every row a transition; sticky (frozen rows
# after the first end); lost calls (the row after each end); an absent
# agent (rows that are not transitions after it left, until it is back)
KINDS = ("plain", "sticky", "lost", "absent")


def _no_transition(cols, t, j):
    """Row t of column j as a row no executed action led to."""
    cols["fin"][t, j], cols["truncated"][t, j] = True, False
    cols["rew"][t, j], cols["acted"][t, j] = 0.0, False


def random_fragment(seed, n_steps=10, n_envs=8, p_end=0.25):
    """A fragment (float64 tensors) with terminations and truncations
    inside and at row T, whose columns cycle through ``KINDS``, random
    values and log-probabilities (the target's ratios to the behaviour on
    both sides of 1)."""
    rng = np.random.default_rng(seed)
    T1 = n_steps + 1
    cols = dict(fin=rng.random((T1, n_envs)) < p_end,
                rew=rng.normal(size=(T1, n_envs)),
                acted=np.ones((T1, n_envs), bool))
    cols["truncated"] = cols["fin"] & (rng.random((T1, n_envs)) < 0.5)
    cols["acted"][0] = False
    # both kinds of end at row T, and inside
    cols["fin"][-1, 0] = cols["truncated"][-1, 0] = True
    cols["fin"][-1, 4], cols["truncated"][-1, 4] = True, False
    cols["fin"][3, 0] = cols["truncated"][3, 0] = True
    for j in range(n_envs):
        kind = KINDS[j % len(KINDS)]
        if kind == "sticky":
            end = 1 if cols["fin"][1, j] else 2
            cols["fin"][end, j] = True
            for t in range(end + 1, T1):
                _no_transition(cols, t, j)
        elif kind == "lost":
            t = 1
            while t < n_steps:
                if cols["fin"][t, j]:
                    _no_transition(cols, t + 1, j)
                    t += 1
                t += 1
        elif kind == "absent":
            leave = 1 + (j // len(KINDS)) % 3
            back = leave + 2 + j // len(KINDS)
            cols["fin"][leave, j] = True
            for t in range(leave + 1, min(back, n_steps) + 1):
                _no_transition(cols, t, j)
    behaviour = rng.uniform(-3.0, -0.1, size=(T1, n_envs))
    target = behaviour + rng.normal(scale=0.8, size=(T1, n_envs))
    f = dict(cols, value=rng.normal(size=(T1, n_envs)),
             value_final=rng.normal(size=(T1, n_envs)),
             target=target, behaviour=behaviour)
    return {name: torch.from_numpy(x) for name, x in f.items()}


def ref_vtrace(f, s, j, gamma, lam, rho_bar, c_bar):
    """``(v_s, advantage_s, rho_s, c_s)`` of the action in row s of env j,
    from the paper's sums: ``v_s = V(x_s) + sum_{k=s}^{e} gamma^{k-s}
    (prod_{i=s}^{k-1} c_i) rho_k delta_k``, up to the end of the episode or
    of the fragment, and ``rho_s (r_{s+1} + gamma v_{s+1} - V(x_s))``; 0
    where no executed action led to row s + 1."""
    col = {name: x[:, j].tolist() for name, x in f.items()}
    if not col["acted"][s + 1]:
        return 0.0, 0.0, 0.0, 0.0
    rew, fin, trunc = col["rew"], col["fin"], col["truncated"]
    value, value_final = col["value"], col["value_final"]
    T = len(rew) - 1
    ratio = [math.exp(col["target"][k] - col["behaviour"][k])
             for k in range(T)]
    rho = [min(rho_bar, x) for x in ratio]
    c = [lam * min(c_bar, x) for x in ratio]

    def boot(row):  # the value after the transition into row
        if fin[row]:
            return value_final[row] if trunc[row] else 0.0
        return value[row]

    def v(row):
        total, weight = value[row], 1.0
        for k in range(row, T):
            delta = rew[k + 1] + gamma * boot(k + 1) - value[k]
            total += weight * rho[k] * delta
            if fin[k + 1]:
                break
            weight *= gamma * c[k]
        return total

    if fin[s + 1]:
        v_next = boot(s + 1)
    else:
        v_next = v(s + 1)  # v(T) is value[T]
    advantage = rho[s] * (rew[s + 1] + gamma * v_next - value[s])
    return v(s), advantage, rho[s], c[s]


def reference(f, **kwargs):
    T, B = f["rew"].shape[0] - 1, f["rew"].shape[1]
    out = torch.tensor([[ref_vtrace(f, t, j, **kwargs) for j in range(B)]
                        for t in range(T)], dtype=torch.float64)
    return VTrace(*out.unbind(-1))


def call(f, mask=True, **kwargs):
    return vtrace(f["rew"], f["fin"], f["truncated"], f["value"],
                  f["value_final"], target_logp=f["target"],
                  behaviour_logp=f["behaviour"],
                  mask=~f["acted"] if mask else None, **kwargs)


def assert_equal_results(got, expected, atol=1e-10):
    assert isinstance(got, VTrace)
    for name, x, y in zip(VTrace._fields, got, expected):
        torch.testing.assert_close(x, y, rtol=0, atol=atol,
                                   msg=lambda m, name=name: f"{name}: {m}")


PARAMS = [  # gamma, lam, rho_bar, c_bar
    (0.99, 1.0, 1.0, 1.0), (0.9, 0.95, 1.0, 1.0), (0.5, 1.0, INF, INF),
    (0.97, 0.8, 2.0, 0.5), (1.0, 1.0, 0.5, 1.5), (0.0, 1.0, 1.0, 1.0),
    (0.9, 0.0, 1.0, 1.0)]


def test_the_fragments_have_every_kind_of_row():
    f = random_fragment(0)
    fin, trunc, live = f["fin"][1:], f["truncated"][1:], f["acted"][1:]
    assert (fin & trunc & live).any() and (fin & ~trunc & live).any()
    assert (~live).any() and (~live[:, 0::4]).sum() == 0  # plain columns
    ratio = (f["target"] - f["behaviour"]).exp()[:-1][live]
    assert (ratio > 2).any() and (ratio < 0.5).any()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma, lam, rho_bar, c_bar", PARAMS)
def test_vtrace_matches_the_paper(seed, gamma, lam, rho_bar, c_bar):
    f = random_fragment(seed)
    kwargs = dict(gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    got = call(f, **kwargs)
    assert all(x.shape == (10, 8) for x in got)
    assert_equal_results(got, reference(f, **kwargs))


def test_without_a_mask_every_row_is_a_transition():
    f = random_fragment(5)
    plain = {name: x[:, 0::4] for name, x in f.items()}
    assert plain["acted"][1:].all()
    kwargs = dict(gamma=0.9, lam=0.9, rho_bar=1.0, c_bar=1.0)
    assert_equal_results(call(plain, mask=False, **kwargs),
                         reference(plain, **kwargs))


def test_the_weights_are_the_clipped_ratios():
    f = random_fragment(1)
    got = call(f, gamma=0.9, lam=0.5, rho_bar=1.5, c_bar=0.7)
    ratio = (f["target"] - f["behaviour"]).exp()[:-1]
    live = f["acted"][1:]
    torch.testing.assert_close(got.rho, torch.where(
        live, ratio.clamp(max=1.5), 0.0))
    torch.testing.assert_close(got.c, torch.where(
        live, 0.5 * ratio.clamp(max=0.7), 0.0))
    assert (got.rho == 1.5).any() and (got.c == 0.35).any()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("clip", [1.0, INF])
@pytest.mark.parametrize("lam", [1.0, 0.9, 0.0])
def test_on_policy_vtrace_is_gae(seed, clip, lam):
    """Target = behaviour: every ratio is 1, vs are the lambda-returns and
    advantages[t] = delta[t] + gamma * adv[t+1] (with lam = 1: GAE's, and
    vs are the full returns)."""
    f = random_fragment(seed)
    f["target"] = f["behaviour"].clone()
    gamma, mask = 0.95, ~f["acted"]
    got = call(f, gamma=gamma, lam=lam, rho_bar=clip, c_bar=clip)
    live = f["acted"][1:]
    assert got.rho.equal(live.double()) and got.c.equal(lam * live.double())
    args = (f["rew"], f["fin"], f["truncated"], f["value"], f["value_final"])
    adv = gae(*args, gamma=gamma, lam=lam, mask=mask)
    torch.testing.assert_close(got.vs, torch.where(
        live, adv + f["value"][:-1], 0.0), rtol=0, atol=1e-12)
    delta = gae(*args, gamma=gamma, lam=0.0, mask=mask)
    after = torch.zeros_like(adv)
    after[:-1] = torch.where(f["fin"][1:-1], 0.0, adv[1:])
    torch.testing.assert_close(got.advantages, delta + gamma * after,
                               rtol=0, atol=1e-12)
    if lam == 1.0:
        torch.testing.assert_close(got.advantages, adv, rtol=0, atol=1e-12)
        torch.testing.assert_close(got.vs, returns(*args, gamma=gamma,
                                                   mask=mask),
                                   rtol=0, atol=1e-12)


def _torchrl_vtrace():
    try:
        from torchrl.objectives.value.functional import (
            vtrace_advantage_estimate)
    except Exception as exc:  # its C++ extension may not load with this torch
        pytest.skip(f"torchrl's vtrace_advantage_estimate does not import: "
                    f"{type(exc).__name__}: {exc}")
    return vtrace_advantage_estimate


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, 0.5),
                                            (INF, INF)])
def test_vtrace_matches_torchrl(seed, rho_bar, c_bar):
    """TorchRL's next-step layout, ``(B, T, 1)``: step t holds x_t, its
    value, the reward into x_{t+1}, done and terminated of that transition
    and the value of the observation it led to (the final one at a
    truncation). It has no lambda and no mask: its results on the rows
    that are transitions are compared."""
    estimate = _torchrl_vtrace()
    f = random_fragment(seed)

    def steps(x):
        return x.T.unsqueeze(-1)

    fin, trunc = f["fin"][1:], f["truncated"][1:]
    next_value = torch.where(trunc, f["value_final"][1:], f["value"][1:])
    # torchrl's rho is exp(log_pi - log_mu): log_pi the target's
    # gamma exact in float32: torchrl multiplies it by its int done flags,
    # in torch's default dtype
    advantages, vs = estimate(
        0.75, steps(f["target"][:-1]), steps(f["behaviour"][:-1]),
        steps(f["value"][:-1]), steps(next_value), steps(f["rew"][1:]),
        steps(fin), steps(fin & ~trunc), rho_thresh=rho_bar,
        c_thresh=c_bar)
    got = call(f, gamma=0.75, rho_bar=rho_bar, c_bar=c_bar)
    live = f["acted"][1:]
    assert live.sum() > 50 and (~live).any()
    torch.testing.assert_close(got.vs[live], vs.squeeze(-1).T[live],
                               rtol=0, atol=1e-10)
    torch.testing.assert_close(got.advantages[live],
                               advantages.squeeze(-1).T[live],
                               rtol=0, atol=1e-10)


def test_columns_are_computed_apart():
    """Each column, whatever its behaviour policy (its lag), gives the
    same results alone as in the batch: the recursion mixes no columns."""
    f = random_fragment(2)
    kwargs = dict(gamma=0.9, lam=0.95, rho_bar=1.0, c_bar=1.0)
    whole = call(f, **kwargs)
    for j in range(8):
        alone = call({name: x[:, j:j + 1] for name, x in f.items()},
                     **kwargs)
        for x, y in zip(whole, alone):
            assert x[:, j:j + 1].equal(y)


def test_rows_without_a_transition_ignore_their_log_probabilities():
    f = random_fragment(3)
    kwargs = dict(gamma=0.9, lam=1.0, rho_bar=1.0, c_bar=1.0)
    expected = call(f, **kwargs)
    no = ~f["acted"][1:]
    for target, behaviour in [(-INF, -INF), (0.0, -INF), (math.nan, 0.0)]:
        g = dict(f, target=f["target"].clone(),
                 behaviour=f["behaviour"].clone())
        g["target"][:-1][no], g["behaviour"][:-1][no] = target, behaviour
        got = call(g, **kwargs)
        assert all(bool(x.isfinite().all()) for x in got)
        assert_equal_results(got, expected, atol=0)
    # and the log-probabilities of row T are never read
    g = dict(f, target=f["target"].clone(), behaviour=f["behaviour"].clone())
    g["target"][-1], g["behaviour"][-1] = math.nan, INF
    assert_equal_results(call(g, **kwargs), expected, atol=0)


def test_log_probabilities_of_T_rows():
    f = random_fragment(4)
    kwargs = dict(gamma=0.9, lam=0.9, rho_bar=1.0, c_bar=1.0)
    g = dict(f, target=f["target"][:-1], behaviour=f["behaviour"][:-1])
    assert_equal_results(call(g, **kwargs), call(f, **kwargs), atol=0)


def test_a_hand_computed_truncation():
    # one env, T = 3: row 1 truncated (final value 10), values 1; the
    # target is twice as likely as the behaviour to take the second action
    rew = torch.tensor([[0.0], [1.0], [2.0], [3.0]], dtype=torch.float64)
    fin = torch.tensor([[True], [True], [False], [False]])
    value = torch.ones(4, 1, dtype=torch.float64)
    value_final = torch.full((4, 1), 10.0, dtype=torch.float64)
    behaviour = torch.log(torch.tensor([[0.5], [0.25], [0.5], [0.1]]))
    target = torch.log(torch.tensor([[0.5], [0.5], [0.5], [0.9]]))
    out = vtrace(rew, fin, fin, value, value_final, target_logp=target,
                 behaviour_logp=behaviour, gamma=0.5, rho_bar=INF,
                 c_bar=1.0)
    assert out.rho[:, 0].tolist() == [1.0, 2.0, 1.0]
    assert out.c[:, 0].tolist() == [1.0, 1.0, 1.0]
    # deltas: 1 + .5 * 10 - 1 = 5 (cut: a truncation), 2 * (2 + .5 - 1) = 3,
    # 3 + .5 - 1 = 2.5; v2 = 1 + 2.5, v1 = 1 + 3 + .5 * 2.5, v0 = 1 + 5
    assert out.vs[:, 0].tolist() == [6.0, 5.25, 3.5]
    # advantages: next targets 10 (the final observation's value), v2 and
    # value[3]: 1 + 5 - 1, 2 * (2 + .5 * 3.5 - 1), 3 + .5 - 1
    assert out.advantages[:, 0].tolist() == [5.0, 5.5, 2.5]


def test_no_gradient_flows_through_the_results():
    f = random_fragment(0)
    target = f["target"].clone().requires_grad_()
    value = f["value"].clone().requires_grad_()
    out = vtrace(f["rew"], f["fin"], f["truncated"], value,
                 f["value_final"], target_logp=target,
                 behaviour_logp=f["behaviour"], gamma=0.9)
    assert not any(x.requires_grad for x in out)


def test_arguments_are_checked():
    f = random_fragment(0)
    args = (f["rew"], f["fin"], f["truncated"], f["value"], f["value_final"])
    logp = f["behaviour"]

    def run(**kwargs):
        kwargs = dict(dict(target_logp=logp, behaviour_logp=logp,
                           gamma=0.9), **kwargs)
        return vtrace(*args, **kwargs)

    with pytest.raises(TypeError, match="target_logp must be a tensor, got "
                                        "ndarray"):
        run(target_logp=logp.numpy())
    with pytest.raises(ValueError, match=r"behaviour_logp must be of shape "
                                         r"\(1 \+ T, B\) = \(11, 8\) or "
                                         r"\(T, B\) = \(10, 8\).*got "
                                         r"\(9, 8\)"):
        run(behaviour_logp=logp[2:])
    with pytest.raises(ValueError, match=r"sum the log-probabilities of an "
                                         r"action's dimensions\), got "
                                         r"\(11, 8, 3\)"):
        run(target_logp=logp.unsqueeze(-1).expand(11, 8, 3))
    for name, x in [("gamma", 1.5), ("lam", -0.1), ("lam", math.nan)]:
        with pytest.raises(ValueError, match=rf"{name} must be in \[0, 1\], "
                                             rf"got {x}"):
            run(**{name: x})
    for name, x in [("rho_bar", 0.0), ("c_bar", -1), ("c_bar", math.nan)]:
        with pytest.raises(ValueError, match=rf"{name} must be positive "
                                             rf"\(math.inf: no clipping\), "
                                             rf"got {x}"):
            run(**{name: x})
    with pytest.raises(ValueError, match="the fragment has truncations: "
                                         "pass value_final"):
        vtrace(*args[:4], target_logp=logp, behaviour_logp=logp, gamma=0.9)
    with pytest.raises(ValueError, match=r"mask must be a bool tensor "
                                         r"shaped as fin \(11, 8\)"):
        run(mask=f["fin"][1:])


# from collected fragments: the recorded log-probabilities and the lag

class Waves(nn.Module):
    """Logits of Discrete(5) from a bounded function of the observation."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 5))
        self.b = nn.Parameter(torch.linspace(0.5, -0.5, 5))

    def forward(self, obs):
        return torch.sin(0.37 * obs) * self.w + self.b


def _logp(policy, batch):
    """``log pi(state.act[t+1] | state.obs[t])``, shape (T, B)."""
    with torch.no_grad():
        logits = policy(batch.state.obs[:-1])
    return torch.distributions.Categorical(logits=logits).log_prob(
        batch.state.act[1:])


def test_vtrace_of_collected_fragments_of_two_versions():
    """Fragments collected by two parameter versions (meta.version 0 and
    1), columns of both in one batch, trained on by a third: the recorded
    log-probabilities of rows 0..T-1 are those of each column's version,
    and V-trace with them is the paper's."""
    made = []

    def factory():  # terminations every 3 steps; time limits at 2, 3, 4
        made.append(None)
        return CountingEnv(term_every=3, trunc_at=1 + len(made))

    torch.manual_seed(0)
    policy = Waves()
    batches, versions = [], []
    with same.rollout(factory, PolicyActor(policy), 7, 3, entropy=11,
                      sticky=True) as feed:
        for _ in range(2):
            batch = next(feed)
            batches.append(batch)
            versions.append(copy.deepcopy(policy))
            with torch.no_grad():  # the learner's step
                for p in policy.parameters():
                    p.add_(torch.randn_like(p))
    assert [b.meta.version.tolist() for b in batches] == [[0] * 3, [1] * 3]
    for batch, version in zip(batches, versions):
        live = acted(batch)[1:]
        torch.testing.assert_close(batch.actor["logp"][:-1][live],
                                   _logp(version, batch)[live])
    # the columns of both batches in one, the policy trained two steps on
    def both(field):
        return torch.cat([field(b) for b in batches], dim=1)

    f = {"rew": both(lambda b: b.state.rew).double(),
         "fin": both(lambda b: b.state.fin),
         "truncated": both(lambda b: b.truncated),
         "acted": both(acted),
         "value": both(lambda b: torch.sin(b.state.obs[..., 0] / 7.0)
                       ).double(),
         "value_final": both(lambda b: torch.sin(b.final[..., 0] / 7.0)
                             ).double(),
         "target": both(lambda b: _logp(policy, b)).double(),
         "behaviour": both(lambda b: b.actor["logp"]).double()}
    live = f["acted"][1:]
    fin, trunc = f["fin"][1:], f["truncated"][1:]
    assert (fin & trunc & live).any() and (fin & ~trunc & live).any()
    assert (~live).any()  # frozen rows
    kwargs = dict(gamma=0.9, lam=0.95, rho_bar=1.0, c_bar=1.0)
    got = call(f, **kwargs)
    assert_equal_results(got, reference(f, **kwargs))
    assert (got.rho[live] < 1).any() and (got.rho[live] == 1).any()


@pytest.mark.parametrize("device", [
    "meta",  # every operation exists off the CPU, without a GPU
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA"))])
def test_on_the_tensors_device(device):
    f = random_fragment(6)
    kwargs = dict(gamma=0.9, lam=0.95, rho_bar=1.0, c_bar=1.0)
    on_cpu = call(f, **kwargs)
    got = call({name: x.to(device) for name, x in f.items()}, **kwargs)
    assert all(x.device.type == device for x in got)
    if device != "meta":
        assert_equal_results(VTrace(*[x.cpu() for x in got]), on_cpu)
