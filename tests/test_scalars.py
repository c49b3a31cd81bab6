"""``log_stats`` and ``flat_scalars``: the tags, values and steps that reach
a writer with ``add_scalar(tag, value, global_step)`` (a fake one here; the
demo's test reads TensorBoard's own files back), and the messages of bad
arguments."""
import functools
import itertools
from collections import namedtuple
from contextlib import closing

import numpy as np
import pytest
import torch

from envs import counting_factory
from generators import CountingActor
from rlplay.engine import flat_scalars, log_stats
from rlplay.engine.rollout import STATS_KEYS, Evaluation, same


class FakeWriter:
    """Records every ``add_scalar`` call, as a SummaryWriter takes it."""

    def __init__(self):
        self.calls = []

    def add_scalar(self, tag, value, global_step):
        self.calls.append((tag, value, global_step))


def test_numbers_arrays_and_containers_become_tags():
    Point = namedtuple("Point", "x y")
    stats = {
        "steps": 12, "lr": np.float32(0.5), "ok": True, "big": np.int64(7),
        "zero_d": np.array(2.5), "tensor": torch.tensor(-1.0),
        "returns": np.array([1.0, 2.0, 6.0]), "lengths": np.array([4]),
        "empty": np.array([]), "grid": torch.tensor([[1, 2], [3, 6]]),
        "nested": {"a": {"b": 1}}, "workers": [{"n": 1}, {"n": 2}],
        "point": Point(3, None), "cause": "ValueError: no", "none": None,
        "text": np.array(["a", "b"]), "other": object(),
        "complex": 1j, "tensor_complex": torch.tensor([1j]),
    }
    assert flat_scalars(stats, prefix="p/") == {
        "p/steps": 12.0, "p/lr": 0.5, "p/ok": 1.0, "p/big": 7.0,
        "p/zero_d": 2.5, "p/tensor": -1.0, "p/returns/mean": 3.0,
        "p/lengths/mean": 4.0, "p/grid/mean": 3.0, "p/nested/a/b": 1.0,
        "p/workers/0/n": 1.0, "p/workers/1/n": 2.0, "p/point/x": 3.0}
    values = flat_scalars(stats)
    assert all(type(value) is float for value in values.values())
    assert list(values)[:3] == ["steps", "lr", "ok"]  # stats's order


def test_a_one_element_array_is_still_an_array():
    """Its tag is the same whether one episode ended or several."""
    for returns in ([5.0], [5.0, 7.0]):
        assert list(flat_scalars({"returns": np.array(returns)})) == \
            ["returns/mean"]


def test_reduce_names_each_reduction():
    values = torch.tensor([1.0, 4.0], requires_grad=True)
    assert flat_scalars({"r": values, "n": 2},
                        reduce={"min": np.min, "max": np.max}) == \
        {"r/min": 1.0, "r/max": 4.0, "n": 2.0}
    assert flat_scalars({"r": values, "n": 2}, reduce={}) == {"n": 2.0}


def test_log_stats_writes_every_scalar_at_its_step():
    writer = FakeWriter()
    written = log_stats(writer, {"loss": torch.tensor(0.25),
                                 "returns": np.array([1.0, 3.0])},
                        np.int64(4096), prefix="train/")
    assert writer.calls == [("train/loss", 0.25, 4096),
                            ("train/returns/mean", 2.0, 4096)]
    assert type(writer.calls[0][2]) is int
    assert written == {"train/loss": 0.25, "train/returns/mean": 2.0}


def test_the_stats_of_a_generator_and_an_evaluation():
    factory = functools.partial(counting_factory, term_every=3)
    writer = FakeWriter()
    feed = same.rollout(factory, CountingActor(), 6, 2)
    with closing(feed):
        for batch in itertools.islice(feed, 2):
            log_stats(writer, feed.stats, feed.stats["steps"],
                      prefix="rollout/")
    # every key of the stats but the list of workers (empty for ``same``);
    # returns and lengths by their mean: two episodes of 3 steps per env
    # and batch
    plain = STATS_KEYS - {"returns", "lengths", "workers"}
    tags = {f"rollout/{key}" for key in plain} | {
        "rollout/returns/mean", "rollout/lengths/mean"}
    assert {tag for tag, _, _ in writer.calls} == tags
    assert len(writer.calls) == 2 * len(tags)
    steps = [step for tag, _, step in writer.calls]
    assert steps == [12] * len(tags) + [24] * len(tags)
    last = {tag: value for tag, value, step in writer.calls if step == 24}
    assert last["rollout/steps"] == 24.0 and last["rollout/batches"] == 2.0
    assert last["rollout/lengths/mean"] == 3.0
    assert last["rollout/returns/mean"] == pytest.approx(
        float(np.mean(feed.stats["returns"])))

    evaluator_stats = {
        "evaluations": 1, "time_evaluate": 0.5, "restarts": 0,
        "last": Evaluation(np.array([8.0, 10.0]), np.array([8, 10]), 3,
                           None, 0),
        "workers": [{"last_cause": None, "lost": 0, "restarts": 0}]}
    assert flat_scalars(evaluator_stats, prefix="eval/") == {
        "eval/evaluations": 1.0, "eval/time_evaluate": 0.5,
        "eval/restarts": 0.0, "eval/last/returns/mean": 9.0,
        "eval/last/lengths/mean": 9.0, "eval/last/version": 3.0,
        "eval/last/control": 0.0, "eval/workers/0/lost": 0.0,
        "eval/workers/0/restarts": 0.0}


@pytest.mark.parametrize("call, message", [
    (lambda: log_stats(object(), {}, 0),
     "writer must have an add_scalar(tag, value, global_step) method, as "
     "a torch.utils.tensorboard.SummaryWriter has, got object"),
    (lambda: log_stats(FakeWriter(), {}, 1.0),
     "step must be an int (the global step), got float"),
    (lambda: log_stats(FakeWriter(), {}, True),
     "step must be an int (the global step), got bool"),
    (lambda: log_stats(FakeWriter(), [1.0], 0),
     "stats must be a dict (a Mapping) of numbers, arrays and nested "
     "containers, got list"),
    (lambda: flat_scalars({}, prefix=None),
     "prefix must be a str, got NoneType"),
    (lambda: flat_scalars({}, reduce=np.mean),
     "reduce must be a dict of names (str) to callables"),
    (lambda: flat_scalars({}, reduce={"mean": "np.mean"}),
     "reduce must be a dict of names (str) to callables"),
    (lambda: flat_scalars({"r": np.ones(2)}, reduce={"all": np.sort}),
     "reduce['all'] must return a number, returned ndarray for 'r'"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert message in str(info.value)


def test_nothing_is_written_when_an_argument_is_bad():
    writer = FakeWriter()
    with pytest.raises(TypeError):
        log_stats(writer, {"a": 1.0, "r": np.ones(2)}, 0,
                  reduce={"all": np.sort})
    assert writer.calls == []



def _cyclic(kind):
    """Stats holding themselves, and the tag where the cycle closes."""
    if kind == "dict":
        stats = {"steps": 1, "inner": {}}
        stats["inner"]["back"] = stats
        return stats, "inner/back"
    workers = [{"n": 1}]
    workers.append(workers)
    return {"workers": workers}, "workers/1"


def _tag_made_twice(tag):
    return f"two entries of stats make the tag '{tag}' .*rename one"


@pytest.mark.parametrize("stats, pattern", [
    (_cyclic("dict")[0], "container inside itself, at 'inner/back': a "
                         "cycle"),
    (_cyclic("list")[0], "container inside itself, at 'workers/1': a "
                         "cycle"),
    ({"count": 10**400}, r"the number at 'count' is too large for a float "
                         r".*: 10000000000000000000\.\.\. with 401 digits"),
    ({"a/b": 1, "a": {"b": 2}}, _tag_made_twice("a/b")),
    ({"a": {"b": 2}, "a/b": 1}, _tag_made_twice("a/b")),
    ({"returns": np.ones(2), "returns/mean": 3.0},
     _tag_made_twice("returns/mean")),
], ids=["dict-cycle", "list-cycle", "huge-int", "slash-key-first",
        "slash-key-last", "reduction-and-key"])
def test_stats_without_flat_tags_are_refused_naming_where(stats, pattern):
    """A cycle (no RecursionError), a number too large for a float (no
    OverflowError) and two entries of one tag (never a value dropped in
    silence) are refused, naming the tag; nothing is written."""
    writer = FakeWriter()
    with pytest.raises(ValueError, match=pattern):
        log_stats(writer, stats, 0)
    assert writer.calls == []
