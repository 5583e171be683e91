"""The prefill model: TTFT = one decode step + prompt tokens / prefill rate, from first tokens."""

from __future__ import annotations

from gate.core.prefill import MAX_CAP, MIN_CAP, PrefillModel


def fed(base_s: float, rate: float, sizes=(10, 200, 400, 800, 50, 600, 300, 1000)) -> PrefillModel:
    m = PrefillModel()
    for n in sizes:
        m.observe(n, base_s + n / rate)
    return m


def test_no_estimate_before_enough_points_or_without_a_positive_slope():
    m = PrefillModel()
    for n in (10, 200, 400, 800, 50, 600, 300):  # 7 of the 8 needed
        m.observe(n, 0.05 + n / 2000)
    assert m.expected_ttft(100, 0) is None and m.auto_prefill_cap(1.0) is None
    flat = PrefillModel()
    for _ in range(10):
        flat.observe(100, 0.2)  # one size only: prefill and step cannot be told apart
    assert flat.rate is None


def test_the_fit_recovers_the_step_and_the_rate_and_predicts_with_what_is_prefilling():
    m = fed(0.05, 2000.0)
    assert abs(m.base_s - 0.05) < 1e-9 and abs(m.rate - 2000.0) < 1e-6
    assert abs(m.expected_ttft(100, 900) - (0.05 + 1000 / 2000)) < 1e-9


def test_the_cap_leaves_room_for_the_objective_and_is_off_when_a_step_alone_misses_it():
    m = fed(0.05, 2000.0)
    assert m.auto_prefill_cap(0.25) in (399, 400)  # (0.25 - 0.05) x 2000, floored
    assert m.auto_prefill_cap(0.051) == MIN_CAP
    assert m.auto_prefill_cap(0.04) is None  # the step is over the objective: no cap helps
    # an objective of 1e305 s (1e308 ms passed `config check`) gave int(inf): OverflowError
    # in `tokengate replay`; now as good as no cap
    assert m.auto_prefill_cap(1e305) == MAX_CAP and m.auto_prefill_cap(float("inf")) == MAX_CAP


def test_old_points_fall_out_so_the_model_follows_the_load():
    m = fed(0.05, 2000.0)
    for n in (10, 200, 400, 800, 50, 600, 300, 1000) * 8:
        m.observe(n, 0.2 + n / 500)
    assert abs(m.base_s - 0.2) < 1e-6 and abs(m.rate - 500.0) < 1e-3


def test_prompts_of_about_one_size_give_no_rate_however_the_noise_falls():
    """TTFTs of 30-50-token chats vary with the decode step, not the prompt: the slope
    through them is noise, and a rate from it would be absurd (and a cap from it useless)."""
    import random

    rng = random.Random(3)
    for _ in range(50):
        m = PrefillModel()
        for _ in range(64):
            m.observe(rng.randint(30, 50), 0.015 + rng.uniform(0.0, 0.02))
        assert m.rate is None and m.auto_prefill_cap(0.2) is None


def test_a_real_slope_through_noise_is_still_measured():
    import random

    rng = random.Random(4)
    m = PrefillModel()
    for _ in range(64):
        n = rng.randint(20, 1000)
        m.observe(n, 0.015 + n / 10_000 + rng.uniform(0.0, 0.02))
    assert m.rate is not None and 7_000 < m.rate < 14_000


def test_a_shared_cached_prefix_costs_no_phantom_prefill_in_the_estimate():
    """Every prompt starts with the same 1,500-token system prompt, which llama-server has
    cached: only the rest is prefilled. The estimate must follow what was measured."""
    import random

    rng = random.Random(5)
    m = PrefillModel()
    for _ in range(64):
        rest = rng.randint(20, 400)
        m.observe(1_500 + rest, 0.02 + rest / 3_000 + rng.uniform(0.0, 0.002))
    assert m.rate is not None and 2_500 < m.rate < 3_600
    expected = m.expected_ttft(1_600, 0)
    assert expected is not None and abs(expected - (0.02 + 100 / 3_000)) < 0.02  # not ~0.53 s
    assert m.expected_ttft(0, 0) == 0.0  # never below zero
