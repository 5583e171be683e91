"""The test model generator: deterministic, cached by parameters, readable by gguf."""

from __future__ import annotations

import gguf
import numpy as np

from tests.llama.make_model import GENERATOR_VERSION, ModelSpec, cached_model, write_model


def test_same_parameters_give_the_same_bytes(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_model(a, n_embd=64, n_layer=1, n_head=2, n_words=20)
    write_model(b, n_embd=64, n_layer=1, n_head=2, n_words=20)
    assert a.read_bytes() == b.read_bytes()
    write_model(b, n_embd=64, n_layer=1, n_head=2, n_words=20, seed=7)
    assert a.read_bytes() != b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf"]  # no tmp files left


def test_cache_key_covers_parameters_and_version():
    base = ModelSpec()
    assert base.key() == ModelSpec(n_head_kv=10, n_ff=1920).key()  # defaults resolved first
    assert base.key() != ModelSpec(n_layer=4).key()
    assert GENERATOR_VERSION >= 1


def test_cached_model_writes_once_and_reuses(tmp_path):
    path = cached_model("fast", directory=tmp_path, n_layer=1)
    mtime = path.stat().st_mtime_ns
    assert cached_model("fast", directory=tmp_path, n_layer=1) == path
    assert path.stat().st_mtime_ns == mtime
    assert cached_model("fast", directory=tmp_path, n_layer=2) != path


def test_written_model_has_the_llama_keys_and_tensors(tmp_path):
    path = tmp_path / "m.gguf"
    spec = write_model(path, n_embd=64, n_layer=2, n_head=4, n_words=30)
    reader = gguf.GGUFReader(path)
    fields = {name: f for name, f in reader.fields.items()}

    def scalar(name):
        field = fields[name]
        return field.parts[field.data[0]][0]

    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert scalar("llama.embedding_length") == 64
    assert scalar("llama.block_count") == 2
    assert scalar("llama.rope.dimension_count") == spec.head_dim == 16
    n_vocab = len(fields["tokenizer.ggml.tokens"].data)
    assert n_vocab > 3 + 256
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 9 * 2
    assert tensors["blk.1.ffn_gate.weight"].shape.tolist() == [64, spec.n_ff]  # ggml order: (in, out)
    assert tensors["output_norm.weight"].data.dtype == np.float32
