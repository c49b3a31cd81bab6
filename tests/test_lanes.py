"""rlplay.engine.lanes, without processes: which stream of fragments each
column of a batch belongs to, and whether it continues that stream."""
import numpy as np
import pytest
import torch

from rlplay.engine.core import Meta
from rlplay.engine.lanes import Lanes


def meta(worker, env, seq, generation=0, as_torch=False):
    n = len(seq)
    fields = dict(version=np.zeros(n, np.int64),
                  worker=np.broadcast_to(worker, n).copy(),
                  env=np.asarray(env), seq=np.asarray(seq),
                  generation=np.broadcast_to(generation, n).copy())
    if as_torch:
        fields = {key: torch.as_tensor(value) for key, value in fields.items()}
    return Meta(**fields)


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
def test_lanes_are_numbered_in_the_order_they_are_first_seen(as_torch):
    lanes = Lanes()
    got, continues = lanes.follow(meta(1, [2, 3], [0, 0], as_torch=as_torch))
    assert got.tolist() == [0, 1] and not continues.any()
    got, continues = lanes.follow(meta(0, [0, 1], [0, 0], as_torch=as_torch))
    assert got.tolist() == [2, 3] and not continues.any()
    got, continues = lanes.follow(meta(1, [2, 3], [1, 1], as_torch=as_torch))
    assert got.tolist() == [0, 1] and continues.all()
    assert lanes.keys() == [(1, 2), (1, 3), (0, 0), (0, 1)]
    assert len(lanes) == 4
    assert lanes.counts == {"new": 4, "generation": 0, "missing": 0,
                            "disorder": 0}


def test_several_fragments_of_one_worker_in_one_batch_chain_left_to_right():
    """A collated batch may hold fragments 0 and 1 of the same worker's
    envs side by side: the second continues the first."""
    lanes = Lanes()
    got, continues = lanes.follow(meta(0, [0, 1, 0, 1], [0, 0, 1, 1]))
    assert got.tolist() == [0, 1, 0, 1]
    assert continues.tolist() == [False, False, True, True]


@pytest.mark.parametrize("seq, generation, count", [
    (3, 0, "missing"),      # seq 2 never came (dropped by max_lag)
    (1, 0, "disorder"),     # repeated
    (0, 0, "disorder"),     # before the last
    (2, 1, "generation"),   # a restart or a resume: row 0 is a reset
])
def test_every_kind_of_gap_breaks_the_lane_and_is_counted(seq, generation,
                                                          count):
    lanes = Lanes()
    lanes.follow(meta(0, [0], [0]))
    lanes.follow(meta(0, [0], [1]))
    got, continues = lanes.follow(meta(0, [0], [seq], generation))
    assert got.tolist() == [0] and continues.tolist() == [False]
    expected = {"new": 1, "generation": 0, "missing": 0, "disorder": 0}
    expected[count] = 1
    assert lanes.counts == expected
    # and the lane follows on from the column that broke it
    got, continues = lanes.follow(meta(0, [0], [seq + 1], generation))
    assert continues.tolist() == [True]


def test_a_state_round_trip_follows_on():
    lanes = Lanes()
    lanes.follow(meta(0, [0, 1], [0, 0]))
    lanes.follow(meta(1, [2], [4], generation=2))
    again = Lanes()
    again.load_state_dict(lanes.state_dict())
    assert again.keys() == lanes.keys() and again.counts == lanes.counts
    got, continues = again.follow(meta(1, [2], [5], generation=2))
    assert got.tolist() == [2] and continues.tolist() == [True]
    got, continues = again.follow(meta(0, [1, 0], [1, 2]))
    assert got.tolist() == [1, 0] and continues.tolist() == [True, False]
    assert again.counts["missing"] == 1
