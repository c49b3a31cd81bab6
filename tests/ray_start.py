"""Starting the tests' local Ray so that it holds on a loaded machine.

``ray.init(address="local", ...)`` starts a GCS server and a raylet, then
waits for the raylet to register with the GCS. Beside other CPU-heavy
work (a load of 5 to 8 on two cores) that start failed with "The current
node timed out during startup" and took every test on Ray down with it,
then passed alone. Two bounds of Ray's own are at play
(ray/_private/node.py, Ray 2.60):

- the wait for the GCS server's port, 30 s, which the environment
  variable ``RAY_gcs_server_port_wait_time_s`` sets: the tests give it
  :data:`GCS_PORT_WAIT` (conftest.py sets it for every Ray they start);
- the wait for the raylet's registration, 30 s, fixed in the code (no
  setting): a start that ran out of it is tried once more (:func:`start`),
  after its processes are killed, with a warning that names the failure.
  Any other failure is raised at once, and a second time out too (its
  processes killed as well).
"""
import warnings

__all__ = ["GCS_PORT_WAIT", "STARTUP_TIMED_OUT", "START_TRIES",
           "RayStartRetried", "start"]

# seconds Ray waits for its GCS server's port (Ray's default: 30)
GCS_PORT_WAIT = 120
# what Ray says when the raylet did not register within its fixed bound
STARTUP_TIMED_OUT = "The current node timed out during startup"
# starts tried: a second one only after that time out
START_TRIES = 2


class RayStartRetried(UserWarning):
    """The tests' local Ray was started again after a start timed out."""


def start(init, clean_up, tries=START_TRIES):
    """``init()``, tried again (at most ``tries`` times in all) only where
    it raised Ray's startup time out, after a :class:`RayStartRetried`
    warning naming the failure; ``clean_up()`` ends what each start that
    timed out left. Returns what ``init()`` returns; the last failure is
    raised with the first one as its cause."""
    first = None
    for attempt in range(1, tries + 1):
        try:
            return init()
        except Exception as exc:
            if STARTUP_TIMED_OUT not in str(exc):
                raise
            clean_up()
            if attempt == tries:
                raise exc from first
            first = first or exc
            warnings.warn(RayStartRetried(
                f"Ray's local node did not start (try {attempt} of "
                f"{tries}: {exc}); starting it again"), stacklevel=2)
