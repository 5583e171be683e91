"""How long a running request should take, so an overrun can be shed (pure).

Expected duration = prompt / prefill rate + max_tokens / per-slot decode rate,
both rates smoothed from llama-server's own `timings`. Until a few requests have
been measured there is no estimate, and nothing is shed on a guess.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class DurationModel:
    alpha: float = 0.2  # EWMA weight of the newest measurement
    min_samples: int = 3
    # Short requests are dominated by HTTP and scheduling noise, not decode speed:
    # never expect less than this, so a busy gate does not shed its smallest requests.
    floor_s: float = 1.0
    decode_tps: float | None = None
    prefill_tps: float | None = None
    samples: int = 0

    def observe(self, *, decode_tps: float | None, prompt_tokens: int | None = None, prompt_s: float | None = None) -> None:
        """Fold in one finished request's measured rates."""
        if decode_tps is not None and decode_tps > 0:
            self.decode_tps = _ewma(self.decode_tps, decode_tps, self.alpha)
            self.samples += 1
        if prompt_tokens and prompt_s and prompt_s > 0:
            self.prefill_tps = _ewma(self.prefill_tps, prompt_tokens / prompt_s, self.alpha)

    def expected_s(self, prompt_tokens: int, max_tokens: int) -> float | None:
        """Seconds the request should need in the worst case, or None before enough samples."""
        if self.samples < self.min_samples or not self.decode_tps:
            return None
        prefill = prompt_tokens / self.prefill_tps if self.prefill_tps else 0.0
        return max(self.floor_s, prefill + max_tokens / self.decode_tps)


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new
