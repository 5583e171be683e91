"""How long a prompt takes to reach its first token on one backend, from measurements (pure).

Every first token gives one point: x = the prompt's tokens plus the prompt tokens that
were already prefilling when it was dispatched (llama-server works through those too),
y = seconds from dispatch to the first token. Over the most recent points a least-squares
line y = base + x / rate separates the two parts of a TTFT under the current load:
`base`, one decode step of whatever else is running (a new prompt joins the next step),
and `rate`, prompt tokens processed per second. Old points fall out, so both follow the
load.

    expected_ttft(prompt, prefilling) = base + (prompt + prefilling) / rate,
                                        within P2's bound

The rules (the estimate acts only on what has been measured):
  P1. There is a line (`rate`, `base_s`, the "model" source) only from `min_points` points
      whose x spans at least MIN_SPAN tokens (largest - smallest) and whose slope is clearly
      above zero (its t-statistic at least MIN_T); else there is none (None), and
      `expected_or_recent` is the median of the last RECENT first tokens (`recent_ttft`).
      Both guard against prompts all of about one size, whose TTFTs differ by decode-step
      noise or by the load of the moment rather than by prompt length: the slope through
      them says nothing of prefill. The t-statistic alone let a slope through when the load
      moved with the prompt's size (a user trial: chats of 67 tokens under one load, 68 under
      a heavier one, first tokens 32-190 ms and 47-243 ms; a slope of 49 ms per token, t = 5,
      on x from 67 to 68: rate 20 tok/s, base -3.2 s).
  P2. The estimate for x is never above the largest first token among the line's points
      times max(1, x / the largest x among them): within the x measured, never beyond what was
      measured; past it, growing at most in proportion to x, as a line with base >= 0 through
      the measured points grows (a cached prefix, base < 0, grows faster: its estimate past
      the measured x is low, which admits and then measures, never refuses on a guess). The
      same trial's line, read at x = 136 (a second chat beside one prefilling, T4), said
      3,465 ms where no first token in the run had taken over 535 ms (none over 243 ms in
      those 64 points), and the gate refused 35 requests in 56 s on such figures, interactive
      chats with slots free among them ("expected wait 0 ms for 0 ahead + first token 3461
      ms"): the line's auto cap, (2 s - base) x rate = 106 tokens, kept a second chat from
      starting beside one prefilling, and T1 judged its wait by the line at 136 tokens. P2
      alone bounds that estimate at 2 x 243 ms; P1 gives no line there at all.
  P3. 0 <= `spread(chance)` <= the largest of its points' first tokens: it is a quantile of
      measured first tokens less their (non-negative) estimate. So, with P2, what T1 adds up
      (estimate + spread) for x within the measured range is at most twice the largest first
      token measured, and past it at most that times x / the largest x.
  P4. `expected_ttft` and `expected_or_recent` never fall as the prompt or what prefills
      grows (admission's ttft_grows_with_prompt; #24): a line of slope > 0 and P2's bound
      both grow with x, and so does their minimum; the median does not read x.

A user saw, before P1's t-statistic, 107,264 tok/s and a "cap" of 213,920 tokens on a
2,048-token pool, from chats of 30-50 tokens.

`spread(chance)`: how far above that estimate the first tokens measured lately came, the
`chance` quantile of (measured - estimated) over the last SPREAD_POINTS points: admission's T1
adds it to the estimate, so that "likely to make its objective" counts the first token's own
spread beside the slots' (a first token 130 or 340 ms after dispatch, as a prompt meets
llama-server's batch between steps or behind one, has a median that jumps between the two).

`auto_prefill_cap(slo_s)` is the most prompt tokens that may prefill at once so that a
request dispatched behind them still gets its first token within the TTFT objective:
(slo - base) x rate, never below MIN_CAP, and no cap at all when `base` alone is over the
objective (nothing admission does can meet it then), or without a line (P1).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

MIN_POINTS = 8
WINDOW = 64
MIN_CAP = 64  # tokens: an automatic cap below this would stall even short chats
MAX_CAP = 2**31 - 1  # tokens: no pool comes near it, so as good as no cap
#: the slope must be this many standard errors above zero (about 99% one-sided with 8 points)
MIN_T = 3.0
#: first tokens whose median is the fallback estimate
RECENT = 16
#: first tokens whose spread above the estimate `spread` takes
SPREAD_POINTS = 32
#: P1: tokens the points' x must span (largest - smallest) for a line; the replay's own fit asks
#: the same (gate/tools/replay/window.py, PREFILL_FIT_SPREAD). A trial's line came from x of 67
#: and 68: at its speed (a 68-token prompt's first token in 29 ms, so over 2,300 tok/s) one token
#: is under 0.5 ms of prefill, nothing against first tokens that varied by 23-535 ms.
MIN_SPAN = 64


@dataclass(slots=True)
class PrefillModel:
    min_points: int = MIN_POINTS
    window: int = WINDOW
    # the points (x, y) as two deques in step: the refit sums each in C, without unzipping (#24)
    _xs: deque[float] = field(default_factory=deque)
    _ys: deque[float] = field(default_factory=deque)
    # (base_s, rate tokens/s, the largest x and the largest y of the points fitted: P2's bound)
    _fit: tuple[float, float, float, float] | None = None
    _recent: float | None = None  # recent_ttft() of the points as they are (None: not computed)
    _spread: tuple[float, float] | None = None  # (chance, spread(chance)) of the points as they are

    def observe(self, tokens: int, ttft_s: float) -> None:
        """One first token: `tokens` = its prompt + prompts prefilling at its dispatch."""
        if tokens <= 0 or not ttft_s > 0:
            return
        self._xs.append(float(tokens))
        self._ys.append(float(ttft_s))
        while len(self._xs) > self.window:
            self._xs.popleft()
            self._ys.popleft()
        self._fit = self._solve()
        self._recent = None
        self._spread = None

    @property
    def points(self) -> int:
        return len(self._xs)

    @property
    def rate(self) -> float | None:
        return None if self._fit is None else self._fit[1]

    @property
    def base_s(self) -> float | None:
        """The fitted intercept: one decode step, less the prefill a cached prefix saves (so
        it may be below zero)."""
        return None if self._fit is None else self._fit[0]

    def expected_ttft(self, prompt_tokens: int, prefilling: int) -> float | None:
        """The line's estimate within P2's bound, or None without a line (P1)."""
        if self._fit is None:
            return None
        return _on_line(self._fit, prompt_tokens + prefilling)

    def recent_ttft(self, last: int = RECENT) -> float | None:
        """The median first-token time (from dispatch) of the last `last` points, or None before
        any: the fallback estimate while there is no fit (prompts of one size give none; #25
        saw TTFT-aware refusals do nothing, silently, with aiperf's fixed sizes). It is measured
        at the current occupancy and follows it; it ignores the prompt's own size."""
        if not self._ys:
            return None
        if last == RECENT and self._recent is not None:
            return self._recent  # the points have not changed since (admission asks per waiter)
        ys = sorted(list(self._ys)[-last:])
        if last == RECENT:
            self._recent = ys[len(ys) // 2]
        return ys[len(ys) // 2]

    def expected_or_recent(self, prompt_tokens: int, prefilling: int) -> float | None:
        """`expected_ttft` when fitted, else `recent_ttft` (None before any first token)."""
        fit = self._fit
        if fit is not None:  # = expected_ttft, inlined: admission asks per waiter on every walk (T2)
            x = prompt_tokens + prefilling
            ttft = fit[0] + x / fit[1]
            bound = fit[3] if x <= fit[2] else fit[3] * x / fit[2]  # P2
            if ttft > bound:
                ttft = bound
            return ttft if ttft > 0.0 else 0.0  # = max(0.0, ttft), NaN included, without the call
        return self.recent_ttft()

    def spread(self, chance: float) -> float:
        """Seconds above `expected_or_recent` within which `chance` of the first tokens measured
        lately came: the nearest-rank `chance` quantile of (measured - estimated, with the fit
        as it is now, else the recent median) over the last SPREAD_POINTS points; 0.0 before any
        point, for a chance of 0, and when they came under the estimate.

        Admission's T1 adds it to the estimate (#25, the example config at 3x on 4 slots: first
        tokens 130 or 340 ms after dispatch, their median of 16 jumping between the two, queued
        newcomers on the low one, and waiters queued on 209 ms were refused 0.1-0.3 s later when
        it read 299 ms: 17 of 325 refusals after a wait, p95 100 ms. In virtual time with the
        same bimodal first tokens, 5 seeds of 60 s: 68 -> 11 refused after a wait, 849 -> 875
        served within the objective, tests/unit/test_first_token_spread.py)."""
        if not self._ys or not chance > 0.0:
            return 0.0
        cached = self._spread
        if cached is not None and cached[0] == chance:
            return cached[1]  # the points have not changed since (asked per newcomer that must wait)
        n = min(len(self._ys), SPREAD_POINTS)
        ys = list(self._ys)[-n:]
        fit = self._fit
        if fit is not None:
            base, rate, _, top = fit  # every point's x is within the line's: P2's bound is `top`
            xs = list(self._xs)[-n:]
            over = sorted([y - max(0.0, min(top, base + x / rate)) for x, y in zip(xs, ys, strict=True)])
        else:
            median = self.recent_ttft() or 0.0
            over = sorted([y - median for y in ys])
        rank = min(n, max(1, math.ceil(chance * n)))
        value = max(0.0, over[rank - 1])
        self._spread = (chance, value)
        return value

    @property
    def source(self) -> str:
        """Where the first-token estimate comes from: "model", "measured" (recent median) or ""."""
        return "model" if self._fit is not None else ("measured" if self._ys else "")

    def auto_prefill_cap(self, slo_s: float) -> int | None:
        """None while unmeasured, and when one decode step alone already takes the objective:
        then no prefill cap can help, and serialising prompts would only cost throughput."""
        if self._fit is None:
            return None
        base, rate, _, _ = self._fit
        if slo_s <= base:
            return None
        cap = (slo_s - base) * rate
        # a near-flat fit (rate ~1e300) or a huge objective gave inf, and int(inf) raised
        return MAX_CAP if not cap < MAX_CAP else max(MIN_CAP, int(cap))

    def _solve(self) -> tuple[float, float, float, float] | None:
        n = len(self._xs)
        if n < self.min_points:
            return None
        xs = self._xs
        x_top = max(xs)
        if x_top - min(xs) < MIN_SPAN:
            return None  # P1: prompts of about one size; a slope through them is not prefill
        # Lists and one pass per sum, in the points' order: the same float operations as the
        # formulas read, so the same fit to the bit (a replay refits on every first token, and
        # the generator form was ~1/6 of its time; tests/unit/test_replay_golden.py pins it).
        ys = self._ys
        mx = sum(xs) / n
        my = sum(ys) / n
        dx = [x - mx for x in xs]
        sxx = sum([d**2 for d in dx])
        if sxx <= 0:
            return None  # every prompt the same size: no way to tell prefill from the step
        slope = sum([d * (y - my) for d, y in zip(dx, ys, strict=True)]) / sxx
        if slope <= 0:
            return None
        intercept = my - slope * mx
        sse = sum([(y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True)])
        if sse > 0 and slope < MIN_T * (sse / (n - 2) / sxx) ** 0.5:
            return None  # the prompts' sizes do not explain their TTFTs: no rate to speak of
        # The intercept is kept as fitted, below zero too: when the prompts share a prefix that
        # llama-server has cached (a system prompt), each TTFT is base + (x - cached) / rate, and
        # only the fitted intercept (base - cached / rate) predicts them. Clamped to 0 it put
        # cached / rate of phantom prefill into every estimate: ~0.5 s for a 1,500-token system
        # prompt at 3,000 tok/s, and TTFT-aware deadlines refused requests that would have made it.
        return intercept, 1.0 / slope, x_top, max(ys)


def _on_line(fit: tuple[float, float, float, float], x: float) -> float:
    """The line at x, within P2's bound (the largest y fitted x max(1, x / the largest x)), >= 0."""
    base, rate, x_top, y_top = fit
    bound = y_top if x <= x_top else y_top * x / x_top
    return max(0.0, min(bound, base + x / rate))
