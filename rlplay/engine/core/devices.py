"""The actor on a device and the device facts, at their 0.1.0 path: they
live in :mod:`rlplay.engine.policy.device` and :mod:`rlplay.engine.devices`
(this module re-exports them)."""
from ..devices import as_device, module_device, normal_device
from ..policy import DevicePolicy

__all__ = ["DevicePolicy", "as_device", "module_device", "normal_device"]
