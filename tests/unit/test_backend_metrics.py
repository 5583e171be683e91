"""The pure merge of llama-server /metrics answers (gate/observe/backend_metrics.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gate.observe.backend_metrics import merge, up_series

LLAMA = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 2
# HELP llamacpp:n_tokens_max Largest observed sequence length
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 5
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def test_one_answer_without_labels_is_unchanged() -> None:
    assert merge([((), LLAMA)]) == LLAMA


def test_several_answers_get_their_labels_and_each_family_once() -> None:
    text = merge([((("backend", "a"),), LLAMA), ((("backend", "b"),), LLAMA.replace(" 2\n", " 7\n"))])
    assert text.count("# TYPE llamacpp:prompt_tokens_total counter") == 1
    assert text.count("# HELP llamacpp:requests_processing ") == 1
    assert 'llamacpp:prompt_tokens_total{backend="a"} 2' in text
    assert 'llamacpp:prompt_tokens_total{backend="b"} 7' in text
    # samples of a family stay together, after its HELP/TYPE
    lines = text.splitlines()
    i = lines.index("# TYPE llamacpp:prompt_tokens_total counter")
    assert lines[i + 1 : i + 3] == ['llamacpp:prompt_tokens_total{backend="a"} 2', 'llamacpp:prompt_tokens_total{backend="b"} 7']
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["backend"] for s in families["llamacpp:prompt_tokens"].samples} == {"a", "b"}


def test_existing_labels_are_kept_after_the_added_ones_and_values_escaped() -> None:
    text = merge([((("backend", 'we"ird\\'),), '# TYPE llamacpp:x gauge\nllamacpp:x{slot="0",k="a,}b"} 1.5 1700000000\n')])
    assert 'llamacpp:x{backend="we\\"ird\\\\",slot="0",k="a,}b"} 1.5 1700000000' in text
    (family,) = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"backend": 'we"ird\\', "slot": "0", "k": "a,}b"}


def test_what_is_not_a_valid_llamacpp_sample_is_dropped() -> None:
    hostile = (
        "# TYPE tokengate_token_budget gauge\n"  # a gate family a backend must not shadow
        "tokengate_token_budget 1\n"
        "process_cpu_seconds_total 3\n"
        "llamacpp:broken{a=1} 2\n"
        "llamacpp:novalue\n"
        "llamacpp:nan_is_fine NaN\n"
        "llamacpp:word x\n"
        '# TYPE llamacpp:odd bogus\nllamacpp:odd{backend="theirs"} 1\n'
    )
    text = merge([((("backend", "a"),), hostile)])
    assert "tokengate_" not in text and "process_" not in text
    assert "broken" not in text and "novalue" not in text and "llamacpp:word" not in text
    assert 'llamacpp:nan_is_fine{backend="a"} NaN' in text
    assert "llamacpp:odd" not in text  # its own backend label cannot be kept beside ours
    assert merge([((), "")]) == ""
    list(text_string_to_metric_families(text))  # parses


def test_up_series_is_one_sample_per_backend() -> None:
    text = up_series([((("backend", "a"),), True), ((("backend", "r"), ("model", "m")), False)])
    assert 'tokengate_backend_metrics_up{backend="a"} 1' in text
    assert 'tokengate_backend_metrics_up{backend="r",model="m"} 0' in text
    (family,) = text_string_to_metric_families(text)
    assert family.type == "gauge"
