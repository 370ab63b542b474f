import math

import numpy as np
import pytest

from ggserve.server.engine.sampling.sampler import SamplingParams, SequenceSampler, sample_batch
from ggserve.server.engine.sampling.filters import top_k_rows, top_p_prefix

# Probabilities 0.5, 0.25, 0.15, 0.10 as logits.
PROBS4 = np.log(np.array([[0.5, 0.25, 0.15, 0.10]], dtype=np.float32))


def _logits(n_rows, n_vocab, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal((n_rows, n_vocab)) * scale).astype(np.float32)


def _draw(logits, params, steps):
    """Tokens drawn by one sampler over `steps` steps on the same logits."""
    s = SequenceSampler(params)
    return [sample_batch(logits, [s])[0].token for _ in range(steps)]


def _only(**kw):
    """Params with every filter off except the ones given; temperature 1."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, seed=7)
    base.update(kw)
    return SamplingParams(**base)


def test_greedy_is_argmax_of_each_row():
    logits = _logits(5, 1000)
    res = sample_batch(logits, [SequenceSampler(SamplingParams(temperature=0.0)) for _ in range(5)])
    assert [r.token for r in res] == list(np.argmax(logits, axis=1))


def test_temperature_zero_equals_greedy_with_default_filters():
    logits = _logits(3, 2000, seed=1)
    t0 = sample_batch(logits, [SequenceSampler(SamplingParams(temperature=0.0, seed=i)) for i in range(3)])
    k1 = sample_batch(logits, [SequenceSampler(SamplingParams(top_k=1, seed=i)) for i in range(3)])
    assert [r.token for r in t0] == [r.token for r in k1] == list(np.argmax(logits, axis=1))


def test_top_k_1_equals_greedy_at_high_temperature():
    logits = _logits(1, 500, seed=2, scale=0.1)
    assert _draw(logits, SamplingParams(top_k=1, temperature=5.0, seed=3), 20) == [int(np.argmax(logits))] * 20


def test_greedy_ties_go_to_lowest_token_id():
    logits = np.array([[0.0, 2.0, 1.0, 2.0]], dtype=np.float32)
    assert sample_batch(logits, [SequenceSampler(SamplingParams(temperature=0))])[0].token == 1


def test_fixed_seed_reproduces_tokens():
    logits = _logits(1, 4000, seed=4, scale=1.0)
    p = SamplingParams(seed=1234)
    assert _draw(logits, p, 40) == _draw(logits, p, 40)


def test_different_seeds_differ():
    logits = _logits(1, 4000, seed=4, scale=0.5)
    a = _draw(logits, SamplingParams(seed=1), 40)
    b = _draw(logits, SamplingParams(seed=2), 40)
    assert a != b


def test_top_k_keeps_exactly_k_best():
    logits = np.array([[1.0, 5.0, 3.0, 4.0, 2.0, 0.0]], dtype=np.float32)
    assert set(_draw(logits, _only(top_k=3, temperature=1e3), 300)) == {1, 2, 3}


def test_top_p_keeps_tokens_until_cumulative_reaches_p():
    # cumulative 0.5, 0.75, 0.90, 1.0: p=0.7 stops at the second token
    assert set(_draw(PROBS4, _only(top_p=0.7, temperature=1e3), 300)) == {0, 1}
    assert set(_draw(PROBS4, _only(top_p=0.8, temperature=1e3), 300)) == {0, 1, 2}


def test_top_p_applies_to_probabilities_after_top_k():
    # after top_k=2 the survivors are 2/3 and 1/3: p=0.6 keeps only the first
    assert set(_draw(PROBS4, _only(top_k=2, top_p=0.6, temperature=1e3), 100)) == {0}


def test_min_p_keeps_tokens_with_probability_at_least_p_times_max():
    logits = np.log(np.array([[0.5, 0.25, 0.2, 0.04, 0.01]], dtype=np.float32))
    # 0.1 * 0.5 = 0.05: 0.04 and 0.01 go
    assert set(_draw(logits, _only(min_p=0.1, temperature=1e3), 300)) == {0, 1, 2}


def test_typical_p_keeps_tokens_closest_to_entropy():
    # entropy 1.208; |-ln p - H| = 0.515, 0.178, 0.689, 1.095 -> order 1, 0, 2, 3
    # cumulative 0.25, 0.75, 0.90: kept until it exceeds p
    assert set(_draw(PROBS4, _only(typical_p=0.2), 50)) == {1}
    assert set(_draw(PROBS4, _only(typical_p=0.5, temperature=1e3), 300)) == {0, 1}
    assert set(_draw(PROBS4, _only(typical_p=0.8, temperature=1e3), 300)) == {0, 1, 2}


def test_repeat_penalty_divides_positive_and_multiplies_non_positive():
    row = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
    s = SequenceSampler(_only(repeat_penalty=2.0), prompt_tokens=[0, 1, 0, 4])
    s.adjust(row)
    assert row.tolist() == [1.0, -2.0, 0.5, 3.0, 0.0]


def test_frequency_and_presence_penalties_subtract_count_and_presence():
    row = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
    s = SequenceSampler(_only(frequency_penalty=0.5, presence_penalty=0.25), prompt_tokens=[0, 1, 0, 4])
    s.adjust(row)
    # token 0 seen twice: 2 - (2*0.5 + 0.25); tokens 1 and 4 once: -0.75
    assert row.tolist() == [0.75, -1.75, 0.5, 3.0, -0.75]


def test_all_penalties_combine_repeat_first():
    row = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
    s = SequenceSampler(_only(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
                        prompt_tokens=[0, 1, 0, 4])
    s.adjust(row)
    assert row.tolist() == [-0.25, -2.75, 0.5, 3.0, -0.75]


def test_repeat_last_n_limits_the_window():
    row = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
    s = SequenceSampler(_only(repeat_penalty=2.0, repeat_last_n=2), prompt_tokens=[3, 1])
    s.accept(0)
    s.accept(0)
    s.adjust(row)    # window [0, 0]: only token 0 is penalised, once
    assert row.tolist() == [1.0, -1.0, 0.5, 3.0, 0.0]


def test_repeat_last_n_minus_one_uses_whole_history():
    row = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
    s = SequenceSampler(_only(frequency_penalty=1.0, repeat_last_n=-1), prompt_tokens=[3] * 100)
    s.accept(0)
    s.adjust(row)
    assert row.tolist() == [1.0, -1.0, 0.5, -97.0, 0.0]


def test_repeat_last_n_zero_disables_penalties():
    logits = np.array([[2.0, -1.0, 0.5, 3.0, 0.0]], dtype=np.float32)
    s = SequenceSampler(SamplingParams(temperature=0, repeat_penalty=10.0, repeat_last_n=0), prompt_tokens=[3])
    assert not s.adjusts_logits
    assert sample_batch(logits, [s])[0].token == 3


def test_penalty_changes_greedy_choice():
    logits = np.array([[2.0, -1.0, 0.5, 3.0, 0.0]], dtype=np.float32)
    s = SequenceSampler(SamplingParams(temperature=0, repeat_penalty=2.0), prompt_tokens=[3])
    assert sample_batch(logits, [s])[0].token == 0    # 3 / 2 = 1.5 < 2


def test_logit_bias_minus_inf_bans_token():
    logits = np.array([[0.0, 10.0, 9.0, 1.0]], dtype=np.float32)
    ban = {1: -math.inf}
    assert sample_batch(logits, [SequenceSampler(SamplingParams(temperature=0, logit_bias=ban))])[0].token == 2
    assert 1 not in _draw(logits, _only(temperature=1e3, logit_bias=ban), 300)


def test_logit_bias_adds_to_logit():
    logits = np.array([[0.0, 10.0, 9.0, 1.0]], dtype=np.float32)
    s = SequenceSampler(SamplingParams(temperature=0, logit_bias={3: 9.5}))
    assert sample_batch(logits, [s])[0].token == 3


def test_logprobs_match_float64_log_softmax():
    logits = _logits(3, 49152, seed=5, scale=4.0)
    logits[1] += 80.0     # large offsets must not overflow
    res = sample_batch(logits, [SequenceSampler(SamplingParams(seed=i, n_probs=5)) for i in range(3)])
    ref = logits.astype(np.float64)
    ref = ref - ref.max(axis=1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
    for i, r in enumerate(res):
        assert abs(r.logprob - ref[i, r.token]) < 1e-5
        best = np.argsort(-ref[i], kind="stable")[:5]
        assert [t for t, _ in r.top] == list(best)
        assert all(abs(lp - ref[i, t]) < 1e-5 for t, lp in r.top)
        assert [lp for _, lp in r.top] == sorted((lp for _, lp in r.top), reverse=True)


def test_logprobs_are_from_raw_logits_not_biased_ones():
    logits = np.array([[0.0, 1.0, 2.0]], dtype=np.float32)
    s = SequenceSampler(SamplingParams(temperature=0, logit_bias={0: 100.0}, n_probs=1))
    r = sample_batch(logits, [s])[0]
    ref = logits[0].astype(np.float64) - np.log(np.exp(logits[0].astype(np.float64)).sum())
    assert r.token == 0
    assert abs(r.logprob - ref[0]) < 1e-6
    assert r.top[0][0] == 2


def test_no_top_list_without_n_probs():
    assert sample_batch(_logits(1, 100), [SequenceSampler(SamplingParams())])[0].top == []


def test_batch_result_equals_per_row_result():
    logits = _logits(6, 8192, seed=6, scale=1.5)
    params = [
        SamplingParams(seed=1),
        SamplingParams(temperature=0, n_probs=3),
        SamplingParams(seed=2, top_k=0, top_p=0.9, min_p=0.0),
        SamplingParams(seed=3, top_k=10, typical_p=0.7, repeat_penalty=1.3),
        SamplingParams(seed=4, top_k=0, top_p=1.0, min_p=0.1, logit_bias={5: 3.0}),
        SamplingParams(seed=5, presence_penalty=0.5, frequency_penalty=0.3, n_probs=2),
    ]
    batch = [SequenceSampler(p, prompt_tokens=[1, 2, 3]) for p in params]
    single = [SequenceSampler(p, prompt_tokens=[1, 2, 3]) for p in params]
    for step in range(10):
        step_logits = np.roll(logits, step, axis=1)
        got = sample_batch(step_logits, batch)
        want = [sample_batch(step_logits[i:i + 1], [s])[0] for i, s in enumerate(single)]
        assert got == want
        for s, b, r in zip(single, batch, got):
            s.accept(r.token)
            b.accept(r.token)


def test_top_k_candidates_equal_full_sort_with_ties():
    logits = np.round(_logits(3, 50000, seed=8), 1)    # many exact ties
    for i, ids in enumerate(top_k_rows(logits, [0, 1, 2], 40)):
        assert list(ids) == list(np.argsort(-logits[i], kind="stable")[:40])


def test_top_p_over_whole_vocab_equals_full_sort():
    row = _logits(1, 20000, seed=9, scale=2.0)[0]
    order = np.argsort(-row, kind="stable")
    p = np.exp(row[order].astype(np.float64) - row.max())
    cdf = np.cumsum(p / p.sum())
    n = int(np.argmax(cdf >= 0.9)) + 1
    assert list(top_p_prefix(row, 0.9)) == list(order[:n])


def test_top_p_and_min_p_keep_the_shorter_prefix():
    # top_p 0.8 keeps {0, 1, 2}; min_p 0.4 keeps p >= 0.2: {0, 1}
    assert set(_draw(PROBS4, _only(top_p=0.8, min_p=0.4, temperature=1e3), 300)) == {0, 1}
    # top_p 0.7 keeps {0, 1}; min_p 0.25 keeps p >= 0.125: {0, 1, 2}
    assert set(_draw(PROBS4, _only(top_p=0.7, min_p=0.25, temperature=1e3), 300)) == {0, 1}


def test_top_p_bounded_by_min_p_set_equals_full_sort():
    row = _logits(1, 20000, seed=10, scale=2.0)[0]
    order = np.argsort(-row, kind="stable")
    p = np.exp(row[order].astype(np.float64) - row.max())
    cdf = np.cumsum(p / p.sum())
    for top_p, min_p in [(0.9, 0.001), (0.3, 0.001), (0.9, 0.3)]:
        thr = np.float32(row.max()) + np.float32(math.log(np.float32(min_p)))
        n = min(int(np.argmax(cdf >= top_p)) + 1, int((row >= thr).sum()))
        assert list(top_p_prefix(row, top_p, np.flatnonzero(row >= thr))) == list(order[:n])


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1),
    ("temperature", math.nan),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("min_p", -0.1),
    ("min_p", 1.1),
    ("typical_p", 0.0),
    ("typical_p", 2.0),
    ("repeat_penalty", 0.0),
    ("repeat_last_n", -2),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("seed", -1),
    ("top_k", 1.5),
    ("n_probs", -1),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {3: math.inf}),
])
def test_validate_rejects_out_of_range(field, value):
    with pytest.raises(ValueError, match=field.split("_bias")[0]):
        SamplingParams(**{field: value}).validate()


def test_validate_accepts_defaults_and_disabled_values():
    SamplingParams().validate()
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                   repeat_last_n=-1, seed=0, logit_bias={3: -math.inf}).validate()


def test_sequence_sampler_validates_params():
    with pytest.raises(ValueError, match="top_p"):
        SequenceSampler(SamplingParams(top_p=0.0))


def test_no_logprob_without_n_probs():
    logits = np.array([[0.0, 1.0, 2.0]], dtype=np.float32)
    assert sample_batch(logits, [SequenceSampler(SamplingParams(temperature=0))])[0].logprob is None
