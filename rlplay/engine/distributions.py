"""Distributions for actors: a Gaussian squashed into a ``Box``
(:func:`squashed_normal`), and what :class:`~.actor.PolicyActor` samples
with: the operations of a ``Categorical`` over logits without the object,
and the mode it takes in eval mode."""
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


def squashed_normal(mean, std, low, high):
    """A Gaussian squashed into the box ``[low, high]``: ``tanh`` of
    ``Independent(Normal(mean, std), 1)``, scaled and shifted onto the box.

    For :class:`PolicyActor` over a ``Box`` action space: every sample lies
    strictly inside the box, so the env executes exactly the recorded
    action, and ``log_prob`` of a sample is exact for it (the inverse of
    the tanh is cached for the value just sampled, so a sample close to
    the bounds does not lose precision; the log-determinant of the squash
    is included).

    Parameters
    ----------
    mean, std : tensor, shape = (..., D)
        Of the Gaussian before the squash.
    low, high : array-like, shape = (D,)
        The bounds (``space.low``, ``space.high``), finite.

    Returns
    -------
    torch.distributions.TransformedDistribution
        Over ``(..., D)``, one joint ``log_prob`` per action.

    Raises
    ------
    ValueError
        Bounds that are not finite, or not ``low < high``.

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
    low = torch.as_tensor(low, dtype=mean.dtype, device=mean.device)
    high = torch.as_tensor(high, dtype=mean.dtype, device=mean.device)
    if not bool(torch.isfinite(low).all() and torch.isfinite(high).all()
                and (low < high).all()):
        raise ValueError(f"squashed_normal needs finite bounds with low < "
                         f"high, got low={low.tolist()} and "
                         f"high={high.tolist()}")
    base = D.Independent(D.Normal(mean, std), 1)
    return D.TransformedDistribution(base, [
        D.TanhTransform(cache_size=1),
        D.AffineTransform((high + low) / 2, (high - low) / 2, event_dim=1)])
