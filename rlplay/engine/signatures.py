"""The signatures of the actor API's methods, checked when a subclass of
:class:`~.actor.BaseActorModule` is defined (and by
:func:`~.actor.check_actor` for a module that follows the API without the
base class), with messages that say what is wrong."""
import inspect

_STEP_POSITIONAL = ("stepno", "obs", "act", "rew", "fin")
_STEP_KEYWORD = ("hx", "virtual")


def _step_problem(params):
    """What is wrong with ``step``'s parameters (``self`` excluded), or
    ``None``."""
    kinds = {p.name: p.kind for p in params}
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return "it must not take *args or **kwargs"
    positional = [p.name for p in params if p.name not in _STEP_KEYWORD
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if tuple(positional) != _STEP_POSITIONAL:
        return (f"its positional inputs are ({', '.join(positional)}), "
                f"expected ({', '.join(_STEP_POSITIONAL)}) in this order")
    if any(kinds[name] is not inspect.Parameter.POSITIONAL_ONLY
           for name in positional):
        return "the five inputs must be positional-only: add '/' after fin"
    keyword = [p.name for p in params if p.name not in positional]
    missing = [name for name in _STEP_KEYWORD if name not in keyword]
    extra = [name for name in keyword if name not in _STEP_KEYWORD]
    if missing or extra:
        return (f"its keyword parameters are ({', '.join(keyword)}), "
                f"expected (hx, virtual)")
    if any(kinds[name] is not inspect.Parameter.KEYWORD_ONLY
           for name in _STEP_KEYWORD):
        return "hx and virtual must be keyword-only: add '*' before hx"
    return None


def _check_step_signature(cls, fn):
    signature = inspect.signature(fn)
    problem = _step_problem(list(signature.parameters.values())[1:])
    if problem is not None:
        raise TypeError(
            f"{cls.__name__}.step has signature step{signature}; the actor "
            f"API expects step(self, stepno, obs, act, rew, fin, /, *, hx, "
            f"virtual): {problem}")


def _check_reset_signature(cls, fn):
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    if _reset_problem(params):
        raise TypeError(
            f"{cls.__name__}.reset has signature reset{signature}; the actor "
            f"API expects reset(self, hx, at): two positional inputs, the "
            f"state and the bool mask of envs to reset")


def _reset_problem(params):
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names != ["hx", "at"] or len(params) != 2


def _check_act_signature(cls, fn):
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    if len(params) != 1 or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError(
            f"{cls.__name__}.act has signature act{signature}; "
            f"FeedForwardActor expects act(self, obs): the observations of "
            f"N envs in, (action, info) out")
