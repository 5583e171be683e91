"""The simulated server's settings: :class:`SimulatorConfig` (slots, context, KV mode, speed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """The simulated server.  Defaults: an A10G running an 8B Q4 model, 4 slots, unified KV."""

    slots: int = 4
    ctx: int = 8192  # total context: the pool (unified) or slots x per-slot context (split)
    kv: Literal["unified", "split"] = "unified"
    ms_per_token_alone: float = 45.0  # per generated token with one slot generating
    ms_per_token_full: float = 180.0  # per generated token, each, with every slot generating
    prefill_tps: float = 1500.0  # prompt tokens per second, shared by the slots prefilling
    n_batch: int = 2048  # most tokens one decode step carries (llama-server's -b)
    seed: int = 0
    speed: float = 1.0  # divides every duration (10 = ten times faster than the model)
    eos_probability: float = 0.01  # per generated token, unless ignore_eos

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        if self.kv not in ("unified", "split"):
            raise ValueError("kv must be 'unified' or 'split'")
        if self.ctx < self.slots:
            raise ValueError("ctx must be >= slots")
        for name in ("ms_per_token_alone", "ms_per_token_full", "prefill_tps", "speed"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.n_batch < 1:
            raise ValueError("n_batch must be >= 1")
        if not 0.0 <= self.eos_probability < 1.0:
            raise ValueError("eos_probability must be in [0, 1)")

    @property
    def slot_ctx(self) -> int:
        """Context one slot reports (/props, /slots): the pool when unified, a share when split."""
        return self.ctx if self.kv == "unified" else self.ctx // self.slots

    def ms_per_token(self, generating: int) -> float:
        """Unscaled time of one decode step with `generating` slots generating (linear in between)."""
        if generating <= 1 or self.slots == 1:
            return self.ms_per_token_alone
        frac = (min(generating, self.slots) - 1) / (self.slots - 1)
        return self.ms_per_token_alone + (self.ms_per_token_full - self.ms_per_token_alone) * frac
