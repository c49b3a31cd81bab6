"""Every fact about devices, once: naming a device (:func:`as_device`,
:func:`normal_device`), where a module's parameters live
(:func:`module_device`), the delivery device checked up front
(:func:`check_device`), and where the actor runs, the ``actor_device``
keyword of the generators, checked up front, before anything starts
(:func:`same_device`, :func:`worker_devices`):

- ``same.rollout`` calls the actor you train, in your process: it runs
  where its parameters live (:func:`module_device`; the rows are moved
  there, see :mod:`rlplay.engine.policy.device`).
  ``actor_device``, if given, names that device (a check; an actor
  without parameters runs there).
- The workers of ``single``, ``multi`` and ``cluster`` run copies of the
  actor, on the CPU by default; ``actor_device`` puts each copy on a
  device (the CPU or a CUDA device; another type is refused up front):
  one for every worker (shared by them), or a list of one per worker. A
  CUDA device is refused where CUDA is absent, under the
  ``fork`` start method (a forked child cannot initialise CUDA once its
  parent did, and the learner does: torch raises "Cannot re-initialize
  CUDA in forked subprocess"), and on a Ray cluster whose workers ask
  for no GPU (Ray hides the GPUs from an actor that asks for none:
  ``actor_options={"num_gpus": ...}``).
"""
import torch

__all__ = ["as_device", "normal_device", "module_device", "check_device",
           "same_device", "worker_devices"]


def as_device(device, name="device", *, alternative=""):
    """``device`` (a ``torch.device`` or a string) as a ``torch.device``,
    with no check that it is present.

    Raises
    ------
    TypeError
        Not a device, naming ``name`` (and ``alternative``, what else the
        argument may be, for the message).
    ValueError
        A string that names no device.
    """
    if isinstance(device, bool) or not isinstance(device, (str,
                                                           torch.device)):
        raise TypeError(f"{name} must be a device (a torch.device or a "
                        f"string such as 'cpu' or 'cuda:0'){alternative}, "
                        f"got {type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"{name}={device!r} is not a device: {exc}") from None


def normal_device(device, name="device"):
    """``device`` (a ``torch.device`` or a string such as ``'cuda'``) as a
    ``torch.device`` with its index where it is a CUDA device (``'cuda'``
    is the current one), so that two names of one device compare equal.

    Raises
    ------
    TypeError, ValueError
        Not a device, naming ``name`` (see :func:`as_device`).
    RuntimeError
        A CUDA device where CUDA is absent.
    """
    device = as_device(device, name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{name}={str(device)!r} needs CUDA, but "
                f"torch.cuda.is_available() is False (torch "
                f"{torch.__version__})")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def module_device(module, strict=True):
    """The device of ``module``'s parameters and buffers (``None`` when it
    has none, or, unless ``strict``, several).

    Raises
    ------
    ValueError
        They live on several devices (``strict``).
    """
    devices = {t.device for t in module.parameters()} | {
        t.device for t in module.buffers()}
    if len(devices) > 1 and not strict:
        return None
    if len(devices) > 1:
        raise ValueError(f"the actor's parameters and buffers live on "
                         f"several devices ({sorted(map(str, devices))}): "
                         f"rlplay runs it on one (actor.to(device))")
    return next(iter(devices), None)


def check_device(device=None, pinned=False):
    """Validate a delivery device and ``pinned`` up front.

    Returns the ``torch.device`` (or ``None``). Raises ``RuntimeError`` with
    a clear message when CUDA is asked for (a CUDA device, or ``pinned=True``)
    and this torch build or machine has none.
    """
    device = None if device is None else torch.device(device)
    needs_cuda = pinned or (device is not None and device.type == "cuda")
    if needs_cuda and not torch.cuda.is_available():
        what = "pinned=True" if pinned else f"device={str(device)!r}"
        raise RuntimeError(
            f"{what} needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); use the default host delivery")
    return device


def same_device(actor, actor_device):
    """The device ``same.rollout`` names to the policy: ``None`` (where
    the actor's parameters live), or ``actor_device`` checked against
    them.

    Raises
    ------
    TypeError, ValueError
        Not a device, or not the one of the actor's parameters.
    RuntimeError
        CUDA asked for and absent.
    """
    if actor_device is None:
        return None
    device = normal_device(actor_device, "actor_device")
    params = module_device(actor)
    if params is not None and normal_device(params) != device:
        raise ValueError(
            f"actor_device={str(actor_device)!r}, but the actor's "
            f"parameters live on {params}: same.rollout runs the actor you "
            f"train where it is; move it (actor.to({str(device)!r})) or "
            f"leave actor_device out")
    return device


# the device types a worker's copy of the actor runs on: the workers move
# rows and parameters between the host and CUDA only
WORKER_DEVICE_TYPES = ("cpu", "cuda")


def _parse(device):
    device = as_device(device, "actor_device",
                       alternative=", or a list of one per worker")
    if device.type not in WORKER_DEVICE_TYPES:
        raise ValueError(f"actor_device={str(device)!r}: a worker runs its "
                         f"copy of the actor on 'cpu' or on a 'cuda' "
                         f"device, not on {device.type!r}")
    return device


def worker_devices(actor_device, n_workers, *, start_method=None,
                   ray_options=None):
    """The device of each worker's copy of the actor: a tuple of
    ``n_workers`` ``torch.device``, or ``None`` (the CPU, the default).

    Parameters
    ----------
    actor_device : None, device, or list of devices
        One device for every worker, or one per worker.
    n_workers : int
    start_method : str, optional
        The workers' (``None``: Ray actors, or the default).
    ray_options : dict, optional
        The Ray actor options of ``cluster`` workers (``None``: processes
        on this machine).

    Raises
    ------
    TypeError, ValueError
        Not a device or a list of ``n_workers`` devices; a device neither
        the CPU nor CUDA (``'mps'``, ``'meta'``, ...); a CUDA device under
        ``fork``, or for Ray workers that ask for no GPU.
    RuntimeError
        A CUDA device for processes on this machine, where CUDA is absent.
    """
    if actor_device is None:
        return None
    if isinstance(actor_device, (list, tuple)):
        if len(actor_device) != n_workers:
            raise ValueError(f"actor_device must be one device, or a list of "
                             f"one per worker ({n_workers}), got a list of "
                             f"{len(actor_device)}")
        devices = tuple(_parse(device) for device in actor_device)
    else:
        devices = (_parse(actor_device),) * n_workers
    if not any(device.type == "cuda" for device in devices):
        return devices
    if ray_options is not None:
        if not ray_options.get("num_gpus"):
            raise ValueError(
                f"actor_device={actor_device!r} puts the workers' actors on "
                f"CUDA, but Ray gives a worker no GPU unless it asks for "
                f"one: actor_options={{'num_gpus': ...}} (a fraction shares "
                f"a GPU)")
        return devices
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"actor_device={actor_device!r} needs CUDA, but "
            f"torch.cuda.is_available() is False (torch "
            f"{torch.__version__})")
    if start_method == "fork":
        raise ValueError(
            f"actor_device={actor_device!r} with start_method='fork': a "
            f"forked worker cannot use CUDA once the learner initialised "
            f"it; use start_method='forkserver' (the default) or 'spawn'")
    return devices
