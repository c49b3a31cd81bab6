"""Checks of a replay buffer's arguments and of a saved state: every entry
of a state is checked, and its arrays copied, before anything is
assigned, so that a refused state leaves the buffer as it was."""
import numpy as np

from ..lanes import Lanes
from ...nested import flatten, suply
from ._nodes import STORE_KEYS

# the entries of every buffer's state_dict() after kind and capacity
STATE_KEYS = ("store", "cur", "hx", "hx_dim", "total", "linked", "lanes",
              "rng")


def shown(value):
    """A value in a message: short."""
    text = repr(value)
    return text if len(text) <= 80 else f"{type(value).__name__} " \
        f"{text[:60]}..."


def check_number(value, name, error=ValueError):
    """``value`` as a float, if it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(
            value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value < 0:
        raise error(f"{name} must be a finite number >= 0, got "
                    f"{shown(value)}")
    return float(value)


def check_gamma(gamma):
    if isinstance(gamma, bool) or not isinstance(
            gamma, (int, float, np.floating, np.integer)) \
            or not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    return float(gamma)


def loaded_int(state, key, where="state", none=False):
    value = state[key] if key in state else None
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < 0:
        raise TypeError(f"{where}[{key!r}] must be an int >= 0, got "
                        f"{shown(value)}")
    return int(value)


def loaded(state, kind, capacity):
    """The entries of a buffer's ``state`` common to every kind, checked
    and copied: store, hx, hx_dim, cur, total, linked, lanes (a
    :class:`~rlplay.engine.lanes.Lanes`), rng (a numpy generator)."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict of state_dict(), got "
                        f"{type(state).__name__}")
    if state.get("kind") != kind or state.get("capacity") != capacity:
        raise ValueError(
            f"a state of {state.get('kind')}(capacity="
            f"{state.get('capacity')}) does not load into "
            f"{kind}(capacity={capacity})")
    for key in STATE_KEYS:
        if key not in state:
            raise ValueError(f"state[{key!r}] is missing: a buffer's "
                             f"state_dict() holds it")
    out = {"store": _loaded_store(state["store"], capacity),
           "hx_dim": loaded_int(state, "hx_dim", none=True),
           "hx": _loaded_hx(state["hx"])}
    try:
        out["cur"] = np.array(state["cur"], np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"state['cur'] must be an array of ints, got "
                        f"{shown(state['cur'])}") from None
    out["total"] = loaded_int(state, "total")
    out["linked"] = loaded_int(state, "linked")
    lanes = state["lanes"]
    out["lanes"] = Lanes()
    try:
        out["lanes"].load_state_dict(lanes)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TypeError(f"state['lanes'] must be a Lanes.state_dict(), "
                        f"got {shown(lanes)} ({exc!r})") from None
    if len(out["cur"]) != len(out["lanes"].keys()):
        raise ValueError(f"state['cur'] must hold one node per lane "
                         f"({len(out['lanes'].keys())}), got "
                         f"{len(out['cur'])}")
    rng = np.random.default_rng()
    try:
        rng.bit_generator.state = state["rng"]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise TypeError(f"state['rng'] must be the state of a numpy "
                        f"{type(rng.bit_generator).__name__}, got "
                        f"{shown(state['rng'])}") from None
    out["rng"] = rng
    return out


def _loaded_store(store, capacity):
    if store is None:
        return None
    if not isinstance(store, dict) or not set(STORE_KEYS) <= store.keys():
        raise TypeError(f"state['store'] must be None or the dict "
                        f"of a buffer's arrays, got {shown(store)}")
    store = suply(np.copy, store)
    for key, leaf in [(key, leaf) for key in store
                      for leaf in flatten(store[key])]:
        if not isinstance(leaf, np.ndarray) or leaf.ndim < 1 \
                or len(leaf) != capacity:
            raise ValueError(
                f"state['store'][{key!r}] must hold arrays of "
                f"{capacity} rows (the capacity), got {shown(leaf)}")
    return store


def _loaded_hx(hx):
    if hx is None:
        return None
    if not isinstance(hx, dict) or not {"node", "total", "data"} \
            <= hx.keys():
        raise TypeError(f"state['hx'] must be None or a dict of "
                        f"node, total and data, got {shown(hx)}")
    return {"node": np.array(hx["node"], np.int64),
            "total": loaded_int(hx, "total", "state['hx']"),
            "data": suply(np.copy, hx["data"])}
