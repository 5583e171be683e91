"""Write a small random-weight llama-architecture GGUF that llama-server loads.

The weights are random (seeded), so generated text is gibberish, but every path
the gate cares about is real: tokenization, the chat template, slots, KV cache,
streaming, metrics.  Needs only ``gguf`` and ``numpy``.

Two sizes:

* ``default`` (n_embd 640, 8 layers, 10 heads, ~45M params, ~90 MB f16): about
  100 tok/s per slot with 4 slots busy on 2 cores, so overload lasts seconds.
* ``fast`` (n_embd 256, 4 layers, 4 heads): over 1000 tok/s per slot, for
  quick tests.

Usage::

    python -m tests.llama.make_model -o PATH [--size fast] [--n-embd 320 ...]
    python -m tests.llama.make_model --cached [--size fast]   # prints the cache path

From Python: ``write_model(path, n_embd=..., ...)`` writes one file;
``cached_model(size=..., **overrides)`` returns a path under
``~/.cache/tokengate/models/`` keyed by the parameters and ``GENERATOR_VERSION``,
generating the file (atomically) only on a cache miss.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import string
import sys
import time
from pathlib import Path

import numpy as np

# Bump whenever the bytes written for the same parameters change.
GENERATOR_VERSION = 1

SPACE = "\u2581"  # SentencePiece's marker for a leading space

# Word pieces of the vocabulary: common English plus the project's own words,
# so test prompts tokenize into whole words rather than bytes.
_WORDS = """
a an the and or but not no yes if then else when while for to of in on at by
with from up down out over under about into after before again here there
i you he she it we they me him her us them my your his its our their this that
these those what which who whom why how all any both each few more most other
some such only own same so than too very can will just should now is are was
were be been being have has had do does did say said says get got make made go
went gone come came see saw know knew think take took give gave find found tell
told ask asked work worked seem feel try leave call keep let begin show hear
play run move live believe hold bring happen write provide sit stand lose pay
meet include continue set learn change lead understand watch follow stop create
speak read allow add spend grow open walk win offer remember love consider appear
buy wait serve die send expect build stay fall cut reach kill remain suggest
raise pass sell require report decide pull time year people way day man thing
woman life child world school state family student group country problem hand
part place case week company system program question number night point home
water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war
history party result morning reason research girl guy moment air teacher force
education quick brown fox jumps lazy dog hello llama server token tokens slot
slots model request requests queue admission gate budget tenant stream prompt
context cache batch decode latency throughput overload refuse retry answer
""".split()

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


#: the fill-in-the-middle tokens of ``fim=True`` (Qwen2.5-Coder's spellings), by GGUF key
FIM_TOKENS = {
    "tokenizer.ggml.fim_pre_token_id": "<|fim_prefix|>",
    "tokenizer.ggml.fim_suf_token_id": "<|fim_suffix|>",
    "tokenizer.ggml.fim_mid_token_id": "<|fim_middle|>",
    "tokenizer.ggml.fim_rep_token_id": "<|repo_name|>",
    "tokenizer.ggml.fim_sep_token_id": "<|file_sep|>",
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Every parameter that changes the bytes of the generated file."""

    n_embd: int = 640
    n_layer: int = 8
    n_head: int = 10
    n_head_kv: int | None = None  # None: same as n_head (no GQA)
    n_ff: int | None = None  # None: 3 * n_embd
    n_ctx_train: int = 4096
    n_words: int = len(_WORDS)
    dtype: str = "f16"  # "f16" or "f32"
    seed: int = 1234
    fim: bool = False  # add fill-in-the-middle tokens (FIM_PRE/SUF/MID/REP/SEP), so /infill runs

    def resolved(self) -> ModelSpec:
        spec = dataclasses.replace(
            self,
            n_head_kv=self.n_head_kv or self.n_head,
            n_ff=self.n_ff or 3 * self.n_embd,
            n_words=min(self.n_words, len(_WORDS)),
        )
        if spec.n_embd % spec.n_head or spec.n_head % spec.n_head_kv:
            raise ValueError(f"n_embd {spec.n_embd} / n_head {spec.n_head} / n_head_kv {spec.n_head_kv} do not divide")
        if spec.dtype not in ("f16", "f32"):
            raise ValueError(f"dtype must be f16 or f32, not {spec.dtype!r}")
        return spec

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def key(self) -> str:
        """Short hash of the resolved parameters and the generator version."""
        fields = dataclasses.asdict(self.resolved())
        if not fields["fim"]:
            del fields["fim"]  # models written before the flag existed keep their key (and cache file)
        blob = json.dumps({"v": GENERATOR_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


SIZES: dict[str, ModelSpec] = {
    "default": ModelSpec(),
    "fast": ModelSpec(n_embd=256, n_layer=4, n_head=4),
}


def build_vocab(n_words: int) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece ('llama') vocabulary: specials, 256 byte tokens, pieces.

    llama.cpp's SPM tokenizer merges two adjacent symbols only when their
    concatenation is itself a token, so every prefix of a word is added too;
    a word whose prefixes are missing falls apart into single characters.
    Longer pieces score higher, so whole words win.
    """
    from gguf import TokenType

    tokens: list[str] = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: llama.cpp's SPM defaults
    types: list[int] = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]  # byte fallback
    types += [TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)

    pieces: dict[str, None] = {}  # insertion-ordered set
    for ch in SPACE + string.ascii_letters + string.digits + string.punctuation:
        pieces[ch] = None
    for ch in string.ascii_lowercase:
        pieces[SPACE + ch] = None
    for word in _WORDS[:n_words]:
        for form in (SPACE + word, word):
            for k in range(2, len(form) + 1):
                pieces[form[:k]] = None
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(TokenType.NORMAL)
        scores.append(float(len(piece)) - i * 1e-4)
    return tokens, scores, [int(t) for t in types]


def _atomic_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_model(path: str | os.PathLike, **params) -> ModelSpec:
    """Write a GGUF to ``path`` (atomically: tmp file + rename); return its spec.

    ``params`` are the fields of :class:`ModelSpec` (``n_embd``, ``n_layer``,
    ``n_head``, ``n_head_kv``, ``n_ff``, ``n_ctx_train``, ``n_words``, ``dtype``,
    ``seed``).  The same parameters always give the same bytes.
    """
    import gguf

    spec = ModelSpec(**params).resolved()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _atomic_path(path)
    tokens, scores, types = build_vocab(spec.n_words)
    fim_ids: dict[str, int] = {}
    if spec.fim:
        for key, text in FIM_TOKENS.items():
            fim_ids[key] = len(tokens)
            tokens.append(text)
            scores.append(0.0)
            types.append(int(gguf.TokenType.CONTROL))
    n_vocab = len(tokens)
    wdtype = np.float16 if spec.dtype == "f16" else np.float32

    try:
        w = gguf.GGUFWriter(str(tmp), arch="llama")
        w.add_name("tokengate-tiny-random-llama")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
        w.add_vocab_size(n_vocab)
        w.add_context_length(spec.n_ctx_train)
        w.add_embedding_length(spec.n_embd)
        w.add_block_count(spec.n_layer)
        w.add_feed_forward_length(spec.n_ff)
        w.add_head_count(spec.n_head)
        w.add_head_count_kv(spec.n_head_kv)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_dimension_count(spec.head_dim)  # must equal n_embd / n_head
        w.add_rope_freq_base(10000.0)

        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(True)
        w.add_chat_template(_CHATML)
        for key, token_id in fim_ids.items():
            w.add_uint32(key, token_id)

        rng = np.random.default_rng(spec.seed)

        def weight(n_out: int, n_in: int) -> np.ndarray:
            # numpy shape is the reverse of ggml's: (out_features, in_features)
            return (rng.standard_normal((n_out, n_in), dtype=np.float32) * 0.02).astype(wdtype)

        def norm(n: int) -> np.ndarray:
            return np.ones(n, dtype=np.float32)  # norm weights stay F32

        q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
        w.add_tensor("token_embd.weight", weight(n_vocab, spec.n_embd))
        w.add_tensor("output_norm.weight", norm(spec.n_embd))
        w.add_tensor("output.weight", weight(n_vocab, spec.n_embd))
        for i in range(spec.n_layer):
            blk = f"blk.{i}."
            w.add_tensor(blk + "attn_norm.weight", norm(spec.n_embd))
            w.add_tensor(blk + "attn_q.weight", weight(q_dim, spec.n_embd))
            w.add_tensor(blk + "attn_k.weight", weight(kv_dim, spec.n_embd))
            w.add_tensor(blk + "attn_v.weight", weight(kv_dim, spec.n_embd))
            w.add_tensor(blk + "attn_output.weight", weight(spec.n_embd, q_dim))
            w.add_tensor(blk + "ffn_norm.weight", norm(spec.n_embd))
            w.add_tensor(blk + "ffn_gate.weight", weight(spec.n_ff, spec.n_embd))
            w.add_tensor(blk + "ffn_up.weight", weight(spec.n_ff, spec.n_embd))
            w.add_tensor(blk + "ffn_down.weight", weight(spec.n_embd, spec.n_ff))

        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return spec


def cache_dir() -> Path:
    """``$TOKENGATE_CACHE`` or ``$XDG_CACHE_HOME/tokengate`` (as the build script), plus ``models/``."""
    root = os.environ.get("TOKENGATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokengate"
    )
    return Path(root) / "models"


def cached_model(size: str = "default", *, directory: str | os.PathLike | None = None, **overrides) -> Path:
    """Path of the cached model for ``SIZES[size]`` with ``overrides``; generate it if missing."""
    spec = dataclasses.replace(SIZES[size], **overrides).resolved()
    path = Path(directory or cache_dir()) / f"tiny-llama-{spec.n_embd}x{spec.n_layer}-{spec.key()}.gguf"
    if not path.is_file():
        write_model(path, **dataclasses.asdict(spec))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--out", help="write the model to this path")
    out.add_argument("--cached", action="store_true", help="use (or fill) the cache; print the path")
    ap.add_argument("--size", choices=sorted(SIZES), default="default")
    for field in dataclasses.fields(ModelSpec):
        kind = str if field.name == "dtype" else int
        ap.add_argument("--" + field.name.replace("_", "-"), type=kind, default=None)
    args = ap.parse_args(argv)

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(ModelSpec) if getattr(args, f.name) is not None}
    started = time.monotonic()
    if args.cached:
        path = cached_model(args.size, **overrides)
        spec = dataclasses.replace(SIZES[args.size], **overrides).resolved()
    else:
        path = Path(args.out)
        spec = write_model(path, **dataclasses.asdict(dataclasses.replace(SIZES[args.size], **overrides)))
    print(f"{spec} in {time.monotonic() - started:.2f}s", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
