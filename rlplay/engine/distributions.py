"""Distributions for actors: a Gaussian squashed into a ``Box``
(:func:`squashed_normal`), and what :class:`~.actor.PolicyActor` samples
with: the operations of a ``Categorical`` over logits without the object,
and the mode it takes in eval mode."""
import math

import torch

__all__ = ["squashed_normal"]


def _sample_logits(logits, greedy=False):
    """``Categorical(logits=logits)``'s ``sample()`` (or ``mode``) and its
    ``log_prob``, without the distribution object.

    The same operations as ``torch.distributions.Categorical`` (torch 2.x):
    the logits are normalised by ``logsumexp``, the probabilities are their
    ``softmax``, and a sample is ``torch.multinomial(probs_2d, 1, True)``,
    so that for the same generator state the actions and log-probabilities
    are identical to the distribution's.
    """
    logits = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    if greedy:
        action = probs.argmax(dim=-1)
    else:
        n_events = probs.shape[-1]
        action = torch.multinomial(probs.reshape(-1, n_events), 1, True)
        action = action.reshape(probs.shape[:-1])
    logp = logits.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    return action, logp


def _mode(dist):
    if isinstance(dist, torch.distributions.Categorical):
        return dist.probs.argmax(-1)
    if isinstance(dist, torch.distributions.TransformedDistribution):
        # the transformed mode of the base (tanh of a Gaussian's mean, for
        # a squashed Gaussian), not the mode of the transformed density
        x = _mode(dist.base_dist)
        for transform in dist.transforms:
            x = transform(x)
        return x
    return dist.mode


class _Squash(torch.distributions.Transform):
    """``y = loc + scale * tanh(x)`` over the last dimension, kept strictly
    inside the box, in one transform with a cache of one.

    One transform rather than ``TanhTransform`` then ``AffineTransform``:
    ``TransformedDistribution.log_prob`` inverts its transforms one after
    the other, and a tanh's cache only hits when it is handed the very
    tensor it produced, which an affine inverse without a cache never
    hands it (``torch.distributions.transforms.Transform.__call__``). Here
    ``log_prob`` of a sample finds the Gaussian draw it came from, so it is
    exact however close to the bounds the sample lies.

    A tanh that rounds to +-1 (``|x|`` above about 9 in float32), or the
    rounding of ``loc +- scale``, would put a sample on a bound or just
    past it; the value is clamped to the nearest representable values
    strictly inside, and the cached draw keeps ``log_prob`` finite.
    """

    domain = torch.distributions.constraints.independent(
        torch.distributions.constraints.real, 1)
    bijective = True
    sign = +1

    def __init__(self, low, high):
        super().__init__(cache_size=1)
        self.loc, self.scale = (high + low) / 2, (high - low) / 2
        self.log_scale = self.scale.log()
        # the first values strictly inside the box, from each bound
        self.inside_low = torch.nextafter(low, high)
        self.inside_high = torch.nextafter(high, low)
        # the largest value below 1 (for atanh of a value read back)
        self.below_one = 1.0 - torch.finfo(low.dtype).eps / 2
        self.codomain = torch.distributions.constraints.independent(
            torch.distributions.constraints.interval(low, high), 1)

    def _call(self, x):
        y = torch.addcmul(self.loc, self.scale, x.tanh())
        return torch.clamp(y, self.inside_low, self.inside_high)

    def _inverse(self, y):
        # only for a value this transform did not produce (a recorded
        # action read back): its own samples come from the cache
        u = ((y - self.loc) / self.scale).clamp(-self.below_one,
                                                 self.below_one)
        return torch.atanh(u)

    def log_abs_det_jacobian(self, x, y):
        # log(1 - tanh(x)^2) = 2 (log 2 - x - softplus(-2x)), stable for
        # large |x| (the form of TanhTransform, from TensorFlow Probability)
        log_det = 2.0 * (math.log(2.0) - x
                         - torch.nn.functional.softplus(-2.0 * x))
        return (self.log_scale + log_det).sum(-1)


def _check_gaussian(mean, std, d):
    """Refuse what ``squashed_normal`` cannot make a distribution of, with
    their values checked on the CPU alone (it runs at every step, and on a
    device reading them back would synchronise the host each time)."""
    for name, value in (("mean", mean), ("std", std)):
        if not isinstance(value, torch.Tensor) \
                or not value.is_floating_point():
            what = f"a {value.dtype} tensor" \
                if isinstance(value, torch.Tensor) else repr(value)
            raise TypeError(f"squashed_normal needs {name} as a floating "
                            f"tensor, got {what}")
    if mean.dim() == 0 or mean.shape[-1] != d:
        raise ValueError(f"squashed_normal needs mean of shape (..., {d}) "
                         f"for bounds of {d} dimension(s), got mean of "
                         f"shape {tuple(mean.shape)}")
    try:
        shape = torch.broadcast_shapes(mean.shape, std.shape)
    except RuntimeError:
        shape = None
    if shape != mean.shape:
        raise ValueError(f"squashed_normal needs std of mean's shape "
                         f"{tuple(mean.shape)} (or one that broadcasts to "
                         f"it), got std of shape {tuple(std.shape)}")
    # the values are read on the host only where they live there: on a
    # device the check would synchronise the host at every step
    if mean.device.type == "cpu" and not bool(
            (torch.isfinite(mean).all() & torch.isfinite(std).all()
             & (std > 0).all())):
        raise ValueError(f"squashed_normal needs a finite mean and a finite "
                         f"std > 0, got mean={_few(mean)} and "
                         f"std={_few(std)}")


def _few(x, n=6):
    """The first values of a tensor, for a message."""
    values = x.detach().flatten()[:n].tolist()
    return f"{values}{' ...' if x.numel() > n else ''}"


def squashed_normal(mean, std, low, high):
    """A Gaussian squashed into the box ``[low, high]``: ``tanh`` of
    ``Independent(Normal(mean, std), 1)``, scaled and shifted onto the box.

    For :class:`PolicyActor` over a ``Box`` action space: every sample lies
    strictly inside the box (a saturated tanh is kept one representable
    value inside a bound), so the env executes exactly the recorded
    action, and ``log_prob`` of a sample is exact for it (the Gaussian
    draw of the value just sampled is cached, so a sample close to or at
    the bounds does not lose precision; the log-determinant of the squash
    is included).

    Parameters
    ----------
    mean, std : tensor, shape = (..., D)
        Of the Gaussian before the squash, finite, ``std > 0``; ``std``
        may have any shape that broadcasts to ``mean``'s (one ``(D,)``
        for all rows).
    low, high : array-like, shape = (D,)
        The bounds (``space.low``, ``space.high``), finite.

    Returns
    -------
    torch.distributions.TransformedDistribution
        Over ``(..., D)``, one joint ``log_prob`` per action.

    Raises
    ------
    TypeError
        ``mean`` or ``std`` not a floating tensor.
    ValueError
        Bounds not of one shape ``(D,)``, not finite, or not ``low <
        high``; ``mean`` whose last dimension is not the bounds', ``std``
        that does not broadcast to ``mean``; a ``mean`` or ``std`` not
        finite, or ``std <= 0`` (the values of bounds, ``mean`` and
        ``std`` are checked where ``mean`` is on the CPU: on a device,
        reading them back would synchronise the host at every step).

    Examples
    --------
    >>> dist = squashed_normal(torch.zeros(3, 2), torch.ones(3, 2),
    ...                        [-1.0, 0.0], [1.0, 4.0])
    >>> act = dist.sample()
    >>> bool(((act > torch.tensor([-1.0, 0.0]))
    ...       & (act < torch.tensor([1.0, 4.0]))).all())
    True
    >>> dist.log_prob(act).shape
    torch.Size([3])
    """
    D = torch.distributions
    if not isinstance(mean, torch.Tensor):
        _check_gaussian(mean, std, 0)  # raises the TypeError
    low = torch.as_tensor(low, dtype=mean.dtype, device=mean.device)
    high = torch.as_tensor(high, dtype=mean.dtype, device=mean.device)
    if low.dim() != 1 or low.shape != high.shape:
        raise ValueError(f"squashed_normal needs bounds low and high of one "
                         f"shape (D,), got shapes {tuple(low.shape)} and "
                         f"{tuple(high.shape)}")
    if mean.device.type == "cpu" and not bool(
            torch.isfinite(low).all() and torch.isfinite(high).all()
            and (low < high).all()):
        raise ValueError(f"squashed_normal needs finite bounds with low < "
                         f"high, got low={low.tolist()} and "
                         f"high={high.tolist()}")
    _check_gaussian(mean, std, len(low))
    # the values were checked above: no second check in Normal
    base = D.Independent(D.Normal(mean, std, validate_args=False), 1)
    return D.TransformedDistribution(base, [_Squash(low, high)])
