"""The start of the tests' local Ray (ray_start.py): tried once more
where Ray's startup timed out, and only then; the logic alone, without
Ray."""
import pytest

import ray_start
from ray_start import RayStartRetried, start

TIMED_OUT = Exception("The current node timed out during startup. This "
                      "could happen because some of the raylet failed to "
                      "startup or the GCS has become overloaded.")


def _init(*outcomes):
    """An ``init`` that raises or returns ``outcomes`` in turn, and the
    list of the clean-ups asked for."""
    calls, cleaned = list(outcomes), []

    def init():
        outcome = calls.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return init, lambda: cleaned.append(len(outcomes) - len(calls)), cleaned


def test_a_start_that_timed_out_is_cleaned_up_and_tried_again():
    init, clean_up, cleaned = _init(TIMED_OUT, "started")
    with pytest.warns(RayStartRetried, match="try 1 of 2: The current node "
                                             "timed out during startup"):
        assert start(init, clean_up) == "started"
    assert cleaned == [1]  # after the first try, before the second


def test_a_second_time_out_is_raised_with_the_first_as_its_cause():
    second = Exception(str(TIMED_OUT))
    init, clean_up, cleaned = _init(TIMED_OUT, second)
    with pytest.warns(RayStartRetried), \
            pytest.raises(Exception) as raised:
        start(init, clean_up)
    assert raised.value is second and raised.value.__cause__ is TIMED_OUT
    assert cleaned == [1, 2]  # after each, the last one too


@pytest.mark.parametrize("error", [
    RuntimeError("Failed to start the raylet"), ValueError("num_cpus"),
    KeyboardInterrupt()])
def test_any_other_failure_is_raised_at_once(error, recwarn):
    init, clean_up, cleaned = _init(error, "started")
    with pytest.raises(type(error)) as raised:
        start(init, clean_up)
    assert raised.value is error and cleaned == [] and not recwarn.list


def test_a_start_that_works_is_tried_once(recwarn):
    init, clean_up, cleaned = _init("started")
    assert start(init, clean_up) == "started"
    assert cleaned == [] and not recwarn.list
    assert ray_start.START_TRIES == 2
