"""What an env batch writes into a row, column by column: observations
(checked against the row's layout), numeric env info, and the actions each
env gets (its own copy); shared by the env batches of :mod:`.batch` and
:mod:`.agents`."""
import numpy as np

from ..nested import StructureError, getitem, suply

# ------------------------------------------------------ observation writes

def _write_obs(tree, j, value, what):
    """``tree[j] = value`` leaf by leaf, checking structure and shape; the
    messages name env ``j`` and ``what`` returned ``value``."""
    try:
        suply(_write_leaf_obs, tree, value, j=j, what=what)
    except (StructureError, TypeError) as exc:
        raise type(exc)(f"env {j} {what}: the observation does not match "
                        f"the observation space: {exc}") from None


def _write_leaf_obs(leaf, obs, j, what):
    _write_array_obs(leaf, j, obs, what)


def _write_array_obs(leaf, j, obs, what):
    # _write_obs for a single-array observation, without the walk
    if type(obs) is not np.ndarray:
        obs = np.asarray(obs)
    if obs.shape != leaf.shape[1:]:
        raise ValueError(f"env {j} {what}: the observation has shape "
                         f"{obs.shape}, its space says {leaf.shape[1:]}")
    leaf[j] = obs


def _obs_writer(example):
    """``write(tree, j, obs, what)`` for observations laid out as
    ``example``."""
    if isinstance(example, np.ndarray):
        return _write_array_obs
    return _write_obs


# ---------------------------------------------------------------- env info

def _write_env_info(keys, info, env_info, env_mask, j):
    for key in keys:
        if key in info:
            _write_info(env_info[key], j, info[key], key)
            env_mask[key][j] = True


def _copy_into(dst, value, *, j):
    dst[j] = value


def _write_info(leaf_tree, j, value, key):
    try:
        if isinstance(leaf_tree, np.ndarray):
            leaf_tree[j] = value
        else:
            suply(_copy_into, leaf_tree, value, j=j)
    except (StructureError, TypeError, ValueError) as exc:
        raise type(exc)(f"env info [{key!r}] does not match its spec: "
                        f"{exc}") from None


# ----------------------------------------------------------------- actions

# how _env_actions hands one env its action: items of a (B,) row are numpy
# scalars, copies already; a (B, ...) row is copied once per step and each
# env gets a view of that fresh copy; a nested row is walked
_ACT_SCALARS, _ACT_ARRAYS, _ACT_NESTED = range(3)


def _act_kind(example, n_leading):
    """The ``_ACT_*`` kind of actions laid out as ``example`` with
    ``n_leading`` more dimensions before the action space's shape."""
    if not isinstance(example, np.ndarray):
        return _ACT_NESTED
    return _ACT_SCALARS if example.ndim == n_leading else _ACT_ARRAYS


def _env_actions(act_row, kind, n_envs):
    """Per-env actions (``[j]``) that are not views of the buffer row, so
    that an env that edits its action in place (``np.clip(a, -1, 1,
    out=a)``) or keeps it does not change what was recorded. A row of
    scalars needs none (``row[j]`` is a numpy scalar, a copy): the caller
    hands it out as it is, without this call."""
    if kind == _ACT_ARRAYS:
        return act_row.copy()
    fresh = suply(_fresh_rows, act_row)
    return [getitem(fresh, j) for j in range(n_envs)]


def _fresh_rows(leaf):
    return leaf if leaf.ndim == 1 else leaf.copy()




# ------------------------------------------------------- a few columns

# up to this many columns are written one by one: a loop over a few ints
# costs a fifth of numpy's indexing by a list (an env batch ends a few
# episodes at a step, typically)
FEW_COLUMNS = 8


def put_at(dst, cols, value):
    """``dst[cols] = value`` for a list of columns ``cols``."""
    if len(cols) <= FEW_COLUMNS:
        for j in cols:
            dst[j] = value
    else:
        dst[cols] = value


def copy_at(dst, src, cols):
    """``dst[cols] = src[cols]`` for a list of columns ``cols`` (a whole
    row of an image observation at a time where they are few)."""
    if len(cols) <= FEW_COLUMNS:
        for j in cols:
            dst[j] = src[j]
    else:
        dst[cols] = src[cols]


def lose_at(fin, rew, cols):
    """The lost calls of the columns ``cols``: ``fin`` set, no reward."""
    if len(cols) <= FEW_COLUMNS:
        for j in cols:
            fin[j] = True
            rew[j] = 0.0
    else:
        fin[cols] = True
        rew[cols] = 0.0
