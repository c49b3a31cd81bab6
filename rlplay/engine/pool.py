"""Shared-memory pools: many buffers in one segment, sized and checked first.

A pool of fragment buffers shared between processes costs two scarce
resources besides memory: space in ``/dev/shm`` (a tmpfs, often small in
containers, where a full disk shows up as ``SIGBUS`` in whichever process
first touches an unbacked page) and file descriptors (every shared torch
storage keeps one open in each process that maps it, and ``forkserver``
hands at most a few hundred to a new process). This module keeps both small
and checks them up front:

- :class:`Segment` allocates *one* segment for a whole pool: a file created
  in ``/dev/shm``, unlinked at once (nothing is left behind, whatever
  happens), reserved with ``posix_fallocate`` (a full tmpfs fails here, with
  :class:`CapacityError`, not later with ``SIGBUS``) and mapped. It travels
  to a worker in its start arguments as one file descriptor, whatever the
  number of buffers and fields.
- :func:`layout` places the leaves of a nested structure of tensors at
  aligned offsets; :func:`views` rebuilds the nested numpy and torch views
  of buffer number ``i`` from that layout in any process.
- :func:`check_capacity` compares what a pool needs with the free space of
  ``/dev/shm`` (:func:`shm_free_bytes`) and with the file-descriptor limit
  (:func:`fd_limit`), and raises :class:`CapacityError` saying what to
  change.
"""
import errno
import multiprocessing.reduction
import os
import resource
import secrets
import tempfile
import weakref

import torch

from .nested import suply
from .errors import CapacityError
from .shared import Aliased

__all__ = [
    "SHM_DIR",
    "ALIGN",
    "FORKSERVER_MAX_FDS",
    "CapacityError",
    "shm_free_bytes",
    "fd_limit",
    "open_fds",
    "check_capacity",
    "Field",
    "layout",
    "views",
    "Segment",
]

# where POSIX shared memory lives on Linux (torch's shared tensors too)
SHM_DIR = "/dev/shm"

# byte alignment of every field in a segment (a cache line; any dtype fits)
ALIGN = 64

# CPython's forkserver refuses to pass a new process more than
# ``MAXFDS_TO_SEND - 4`` = 251 file descriptors (multiprocessing/forkserver.py)
FORKSERVER_MAX_FDS = 251

# file descriptors a process needs besides the ones counted (interpreter,
# torch, pipes of multiprocessing)
_FD_MARGIN = 32


def shm_free_bytes(path=SHM_DIR):
    """Free bytes of the file system at ``path`` (``/dev/shm``), or ``None``
    when it does not exist."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def fd_limit():
    """The soft limit on open file descriptors of this process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def open_fds():
    """The number of file descriptors this process has open now."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _mib(nbytes):
    return f"{nbytes / 2**20:.1f} MiB"


def check_capacity(nbytes, n_fds=0, *, what="the pool", path=SHM_DIR,
                   worker_fds=0, start_method=None, hint=""):
    """Check up front that shared memory and file descriptors suffice.

    Parameters
    ----------
    nbytes : int
        Bytes of shared memory about to be allocated in ``path``.
    n_fds : int
        File descriptors this process is about to open.
    what : str
        What is being allocated, for the message.
    path : str
        The shared-memory file system (``/dev/shm``).
    worker_fds : int
        File descriptors each worker is handed at start (one per shared
        storage in its arguments).
    start_method : str, optional
        With ``'forkserver'``, ``worker_fds`` must also fit in what CPython's
        fork server can pass to a new process.
    hint : str
        Appended to the message about shared memory (another way out).

    Raises
    ------
    CapacityError
        With what was needed, what is available and what to change.
    """
    free = shm_free_bytes(path)
    if free is not None and nbytes > free:
        raise CapacityError(
            f"{what} needs {_mib(nbytes)} of shared memory but {path} has "
            f"only {_mib(free)} free: lower n_buffers, n_steps or the envs "
            f"per worker, or enlarge {path} (docker run --shm-size=...)"
            f"{hint}")
    limit = fd_limit()
    if limit is not None:
        have = open_fds()
        if have + n_fds + _FD_MARGIN > limit:
            raise CapacityError(
                f"{what} needs {n_fds} more file descriptors ({have} open, "
                f"limit {limit}): use fewer workers or raise the limit "
                f"(ulimit -n, or resource.setrlimit(RLIMIT_NOFILE))")
        if worker_fds + _FD_MARGIN > limit:
            raise CapacityError(
                f"each worker of {what} is handed {worker_fds} file "
                f"descriptors (one per shared storage), over the limit of "
                f"{limit}: raise it (ulimit -n)")
    if start_method == "forkserver" and worker_fds > FORKSERVER_MAX_FDS:
        raise CapacityError(
            f"each worker of {what} is handed {worker_fds} file descriptors "
            f"(one per shared storage) but the forkserver start method "
            f"passes at most {FORKSERVER_MAX_FDS}: use start_method='spawn' "
            f"(or 'fork')")


class Field:
    """Where one leaf lives in a segment: byte ``offset``, ``shape``,
    ``dtype`` and ``nbytes``.

    A plain class (not a tuple) so that nested utilities see it as a leaf.
    """

    __slots__ = ("offset", "shape", "dtype", "nbytes")

    def __init__(self, offset, shape, dtype, nbytes):
        self.offset, self.shape, self.dtype = offset, tuple(shape), dtype
        self.nbytes = nbytes

    def __getstate__(self):
        return self.offset, self.shape, self.dtype, self.nbytes

    def __setstate__(self, state):
        self.offset, self.shape, self.dtype, self.nbytes = state

    def __repr__(self):
        return (f"Field(offset={self.offset}, shape={self.shape}, "
                f"dtype={self.dtype})")


def _aligned(n, align=ALIGN):
    return -(-n // align) * align


def layout(tree, align=ALIGN):
    """Place the leaves of ``tree`` one after another at aligned offsets.

    Parameters
    ----------
    tree : nested tensors
        Example leaves: only their shapes and dtypes are used.

    Returns
    -------
    spec : nested :class:`Field`
        ``tree``'s structure with the place of each leaf.
    stride : int
        Bytes one such structure takes (a multiple of ``align``), the
        distance between consecutive buffers of a pool.

    Examples
    --------
    >>> spec, stride = layout({"a": torch.zeros(3, dtype=torch.float64),
    ...                        "b": torch.zeros(2, dtype=torch.bool)})
    >>> spec["a"].offset, spec["b"].offset, stride
    (0, 64, 128)
    """
    end = [0]

    def place(leaf):
        nbytes = leaf.numel() * leaf.element_size()
        field = Field(end[0], leaf.shape, leaf.dtype, nbytes)
        end[0] = _aligned(end[0] + nbytes, align)
        return field

    spec = suply(place, tree)
    return spec, max(end[0], align)


def views(flat, spec, base=0):
    """Numpy and torch views of the structure at byte ``base`` of ``flat``.

    Parameters
    ----------
    flat : torch.Tensor, uint8, 1-D
        The mapped segment (:attr:`Segment.flat`).
    spec : nested :class:`Field`
        From :func:`layout`.
    base : int
        Byte offset of the structure (``index * stride``).

    Returns
    -------
    Aliased(npy, pyt)

    Examples
    --------
    >>> spec, stride = layout({"x": torch.zeros(2, 3)})
    >>> segment = Segment.create(2 * stride)
    >>> first, second = (views(segment.flat, spec, i * stride)
    ...                  for i in range(2))
    >>> second.npy["x"][1, 2] = 7.0
    >>> float(first.pyt["x"].sum()), float(second.pyt["x"].sum())
    (0.0, 7.0)
    >>> del first, second
    >>> segment.close()
    """
    def view(field):
        start = base + field.offset
        return flat[start:start + field.nbytes].view(field.dtype).view(
            field.shape)

    pyt = suply(view, spec)
    return Aliased(suply(torch.Tensor.numpy, pyt), pyt)


class Segment:
    """One shared-memory segment, mapped in this process.

    The owner makes it with :meth:`create`; pickled in a process's start
    arguments (any start method) it travels as one file descriptor and is
    mapped again on arrival; a forked child inherits the mapping. The
    memory is freed when every process has closed its segment (or exited):
    the file has no name after :meth:`create` returns.

    Attributes
    ----------
    nbytes : int
    fd : int or None
        The descriptor to hand to workers (``None`` after
        :meth:`close_fd`).
    flat : torch.Tensor, uint8, shape = (nbytes,)
        The whole segment; build field views with :func:`views`.
    """

    def __init__(self, fd, nbytes):
        self.nbytes, self.fd = nbytes, fd
        # a segment dropped without close() still closes its descriptor
        self._fd_closer = weakref.finalize(self, os.close, fd)
        # torch maps the file itself (as torch.multiprocessing does for the
        # descriptors it receives): the views are then shared tensors whose
        # storage keeps the mapping alive as long as any of them lives
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
        self.flat = torch.empty(0, dtype=torch.uint8).set_(storage)

    @classmethod
    def create(cls, nbytes, *, what="the pool", path=SHM_DIR):
        """Allocate and reserve ``nbytes`` of shared memory.

        Raises
        ------
        CapacityError
            The file system at ``path`` cannot hold ``nbytes``.
        """
        folder = path if os.path.isdir(path) else tempfile.gettempdir()
        name = os.path.join(folder, f"rlplay-pool-{os.getpid()}-"
                                    f"{secrets.token_hex(8)}")
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.unlink(name)  # no name left behind, whatever happens next
            try:
                # reserve every page now: a tmpfs that runs out fails here
                # instead of raising SIGBUS in a worker later
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise CapacityError(
                        f"{what} needs {_mib(nbytes)} of shared memory, "
                        f"which {folder} could not reserve ({exc.strerror}): "
                        f"lower n_buffers, n_steps or the envs per worker, "
                        f"or enlarge {folder}") from None
                os.ftruncate(fd, nbytes)  # a file system without fallocate
            return cls(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise

    def __reduce__(self):
        if self.fd is None:
            raise TypeError("this segment's descriptor was closed: it can "
                            "no longer be handed to a new process")
        # DupFd hands the descriptor to the process being started
        # (multiprocessing.reduction), as torch does for shared tensors
        return _rebuild_segment, (multiprocessing.reduction.DupFd(self.fd),
                                  self.nbytes)

    @classmethod
    def attach(cls, fd, nbytes):
        """Map a segment received from its owner; takes ``fd`` over."""
        try:
            segment = cls(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        segment.close_fd()  # the mapping keeps its own duplicate
        return segment

    def close_fd(self):
        """Close the descriptor kept for handing over (the mapping stays)."""
        self.fd = None
        self._fd_closer()

    def close(self):
        """Let go of the segment; idempotent.

        The mapping is released when the last view of it dies (at once if
        none is alive), never under a batch the user still holds.
        """
        self.close_fd()
        self.flat = None


def _rebuild_segment(dup, nbytes):
    return Segment.attach(dup.detach(), nbytes)
