"""Running statistics that travel with the parameters.

:class:`RunningNorm` is an ``nn.Module`` whose running count, mean and sum
of squared deviations are *buffers*: put it inside the actor, update it on
the learner from the batches, and every worker normalizes with the
statistics of the parameter version it loaded (buffers travel with the
parameters to worker processes and Ray actors), the ``Evaluator`` with
those of the version submitted, and ``state_dict`` saves them with the
actor.
"""
import math
import numbers

import torch
from torch import nn

from ..core.layout import acted

__all__ = ["RunningNorm"]


class RunningNorm(nn.Module):
    """Normalize inputs by the running mean and variance of what it was fed.

    Statistics are float64 (count, mean, sum of squared deviations) and
    merged batch by batch with Chan et al.'s parallel update, so that
    feeding the data in any split gives numpy's mean and (population)
    variance of all of it, to rounding.

    Parameters
    ----------
    shape : tuple of int
        The shape of one input (the trailing dimensions), each at least 1
        (``()`` for scalars).
    eps : float
        Added to the variance before the square root: finite, at least 0.
    clip : float, optional
        Clip the normalized values to ``[-clip, clip]``: a number above 0
        (``inf`` clips nothing, as ``None``).

    Raises
    ------
    TypeError
        ``shape`` not a sequence of ints, ``eps`` or ``clip`` not a number.
    ValueError
        A dimension below 1, ``eps`` below 0 or not finite, ``clip`` not
        above 0 (NaN included).

    Examples
    --------
    >>> norm = RunningNorm((2,))
    >>> norm.update(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
    >>> norm.mean.tolist(), norm.var.tolist()
    ([2.0, 20.0], [1.0, 100.0])
    >>> norm(torch.tensor([[3.0, 30.0]]))
    tensor([[1., 1.]])
    """

    def __init__(self, shape, *, eps=1e-8, clip=None):
        super().__init__()
        self.shape = _check_shape(shape)
        self.eps, self.clip = _check_eps(eps), _check_clip(clip)
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(self.shape,
                                                 dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(self.shape,
                                               dtype=torch.float64))

    @property
    def var(self):
        """The population variance of what was fed (0 before any)."""
        return self.m2 / self.count.clamp(min=1)

    @torch.no_grad()
    def update(self, x, mask=None):
        """Merge the inputs ``x`` (``(..., *shape)``) into the statistics;
        with ``mask`` (shaped as ``x``'s leading dimensions), only where it
        is True."""
        x = torch.as_tensor(x).detach().to("cpu", torch.float64)
        n_lead = x.dim() - len(self.shape)
        if n_lead < 0 or tuple(x.shape[n_lead:]) != self.shape:
            raise ValueError(f"inputs of shape {tuple(x.shape)} do not end "
                             f"with the normalized shape {self.shape}")
        x = x.reshape(-1, *self.shape)
        if mask is not None:
            mask = torch.as_tensor(mask).to("cpu").reshape(-1)
            if mask.shape[0] != x.shape[0]:
                raise ValueError("mask must be shaped as the inputs' "
                                 "leading dimensions")
            x = x[mask.bool()]
        n = x.shape[0]
        if n == 0:
            return
        mean_b = x.mean(0)
        m2_b = (x - mean_b).square().sum(0)
        total = self.count + n
        delta = mean_b - self.mean
        self.mean += delta * (n / total)
        self.m2 += m2_b + delta.square() * (self.count * n / total)
        self.count.copy_(total)

    def update_from(self, batch, field=None):
        """Merge the observations of a batch of any generator: each one the
        actor saw once, rows ``1 .. T`` that an executed action led to
        (:func:`~rlplay.engine.core.acted`: not the frozen rows of a sticky
        fragment, nor lost calls; row 0 repeats the previous fragment's
        row ``T``). ``field(obs)`` picks the input from a structured
        observation."""
        obs = batch.state.obs if field is None else field(batch.state.obs)
        self.update(obs[1:], acted(batch)[1:])

    def forward(self, x):
        std = (self.var + self.eps).sqrt()
        out = (x - self.mean.to(x.device)) / std.to(x.device)
        if self.clip is not None:
            out = out.clamp(-self.clip, self.clip)
        return out.to(x.dtype if x.is_floating_point() else torch.float32)


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got "
                        f"{type(value).__name__} {value!r}")
    return float(value)


def _check_shape(shape):
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"shape must be a tuple of ints, got "
                        f"{type(shape).__name__} {shape!r}")
    shape = tuple(shape)
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"shape must be a tuple of ints, got {shape!r}")
        if n < 1:
            raise ValueError(f"shape must be a tuple of ints >= 1, got "
                             f"{shape!r}")
    return tuple(int(n) for n in shape)


def _check_eps(eps):
    value = _number("eps", eps)
    if not 0 <= value < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return value


def _check_clip(clip):
    if clip is None:
        return None
    value = _number("clip", clip)
    if not value > 0:
        raise ValueError(f"clip must be None or a number > 0, got {clip!r}")
    return value
