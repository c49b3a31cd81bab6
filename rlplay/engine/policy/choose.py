"""Choosing the policy of an actor (:func:`as_policy`): local, or on a
device of its own."""
from ..actor import check_actor
from ..devices import module_device, normal_device
from .device import DevicePolicy
from .local import FeedForwardPolicy, LocalPolicy, Policy, feeds_forward

__all__ = ["as_policy"]


def as_policy(actor, rows=None, device=None):
    """``actor`` as a policy: itself if it is one (a
    :class:`~.local.Policy`: a :class:`~.local.LocalPolicy`, a
    :class:`~.device.DevicePolicy`, ...); else, for rows that live on
    ``rows`` (a device, the host by default), a
    :class:`~.device.DevicePolicy` where ``device`` is given or where the
    actor's parameters (:func:`~rlplay.engine.devices.module_device`) live
    elsewhere, and where they live with the rows (or the actor has none) a
    :class:`~.local.FeedForwardPolicy` for a feed-forward actor with its
    own ``step``, else a :class:`~.local.LocalPolicy`."""
    if isinstance(actor, Policy):
        return actor
    if device is None:
        check_actor(actor)
        # an actor over several devices moves its inputs itself
        device = module_device(actor, strict=False)
        if device is None or normal_device(device) == normal_device(
                "cpu" if rows is None else rows):
            return FeedForwardPolicy(actor) if feeds_forward(actor) \
                else LocalPolicy(actor)
    return DevicePolicy(actor, device)
