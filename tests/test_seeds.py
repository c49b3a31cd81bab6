"""The seeding tree: collectors, envs, restart generations, named indices."""
import numpy as np

from rlplay.engine import seeds as S


def states(sequences):
    return [tuple(ss.generate_state(4)) for ss in sequences]


def test_seed_sequences_are_reproducible_and_distinct():
    first = states(S.env_seed_sequences(123, 4))
    assert first == states(S.env_seed_sequences(123, 4))
    assert len(set(first)) == 4
    assert set(first).isdisjoint(states(S.env_seed_sequences(124, 4)))


def test_seed_sequences_come_from_spawn_not_seed_plus_i():
    # the tree is root -> collector -> env, each child by spawn keys
    root = np.random.SeedSequence(7)
    collector = root.spawn(1)[0]
    expected = [tuple(s.generate_state(4)) for s in collector.spawn(3)]
    assert states(S.env_seed_sequences(7, 3)) == expected
    assert states(S.env_seed_sequences(root, 3)) == expected
    plus_i = [tuple(np.random.SeedSequence(7 + i).generate_state(4))
              for i in range(3)]
    assert set(expected).isdisjoint(plus_i)


def test_collector_seeds_do_not_depend_on_the_pool_size():
    lone = states(S.env_seed_sequences(5, 2, collector=0))
    second = states(S.env_seed_sequences(5, 2, collector=1))
    assert lone != second
    assert set(lone).isdisjoint(second)
    c1 = S.collector_seed_sequence(5, 1)
    assert c1.spawn_key == (1,) and c1.entropy == 5


def test_seed_sequence_fresh_entropy():
    a, b = S.seed_sequence(None), S.seed_sequence(None)
    assert a.entropy != b.entropy
    ss = np.random.SeedSequence(3)
    assert S.seed_sequence(ss) is ss



def test_restart_generations_have_streams_of_their_own():
    # generation 0 is the collector itself; later generations draw from a
    # branch of their own, apart from every collector, the probe and the
    # evaluator, and from each other
    gen0 = states(S.env_seed_sequences(5, 3, collector=1))
    assert gen0 == states(S.env_seed_sequences(5, 3, collector=1,
                                               generation=0))
    gens = [states(S.env_seed_sequences(5, 3, collector=1, generation=g))
            for g in (1, 2)]
    others = gen0 + states(S.env_seed_sequences(5, 3, collector=0)) \
        + states(S.env_seed_sequences(5, 3, collector=2)) \
        + states(S.env_seed_sequences(5, 3, S.PROBE_COLLECTOR)) \
        + states(S.env_seed_sequences(5, 3, S.EVAL_COLLECTOR))
    assert set(gens[0]).isdisjoint(others)
    assert set(gens[1]).isdisjoint(others + gens[0])
    # reproducible
    assert gens[0] == states(S.env_seed_sequences(5, 3, 1, generation=1))
    assert S.collector_seed_sequence(5, 1, 2).spawn_key == (
        S.RESTART_BRANCH, 1, 2)


def test_reset_seed_and_next_reset_seeds():
    seqs = S.env_seed_sequences(3, 2)
    assert S.reset_seed(None) is None
    assert S.reset_seed(seqs[0]) == int(seqs[0].generate_state(1)[0])
    first, second = S.next_reset_seeds(seqs), S.next_reset_seeds(seqs)
    assert states(first) != states(second)
    assert first[0].spawn_key == (*seqs[0].spawn_key, 0)
