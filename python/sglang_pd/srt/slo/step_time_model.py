"""Online robust linear fits for SLO admission: decode step time and time to first token.

`RobustLinearFit` keeps the last `window` samples (x, y), weights them by age (weight halves every
`half_life` samples, so the fit follows a drifting machine) and fits y = b0 + b.x by Huber-weighted
iteratively reweighted least squares (a few passes; a sample whose residual is far beyond the
median absolute residual gets a small weight, so a step slowed by a stray stall or a neighbour
process does not drag the fit). A tiny ridge term keeps collinear features (requests vs tokens
move together) well-posed, and slopes are kept non-negative: a feature the window barely varies
(e.g. uncached tokens when every request hits the cache) cannot get a negative slope that would
make a larger request look faster. Coefficients are refit lazily, at most every `refit_every` samples.

`StepTimeModel` fits seconds per decode step against (running requests, running tokens / 1000,
local-prefill tokens / 1000): a step that also ran a decode-local prefill extend (local_prefill/queue.py)
costs more, and that cost is learnt, not hidden in the noise.
No SGLang import: testable on plain numbers and recorded traces.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

_HUBER_K = 1.345  # Huber's tuning constant, in units of the robust residual scale
_IRLS_PASSES = 4
_RIDGE = 1e-6


class FitSnapshot(NamedTuple):
    """The current fit: intercept and slopes (None until ready), and how many samples back it."""

    intercept: float | None
    slopes: tuple[float, ...] | None
    num_samples: int


@dataclass
class RobustLinearFit:
    """Decaying-window Huber fit of y on `num_features` features. Not thread-safe (scheduler thread)."""

    num_features: int
    window: int = 512
    half_life: float = 256.0
    refit_every: int = 8
    min_samples: int = 16
    min_distinct_x0: int = 3  # distinct values of the first feature needed before trusting a slope

    def __post_init__(self):
        self._xs: deque[tuple[float, ...]] = deque(maxlen=self.window)
        self._ys: deque[float] = deque(maxlen=self.window)
        self._coef: np.ndarray | None = None
        self._since_fit = 0

    def add(self, x: Sequence[float], y: float) -> None:
        """Record one observation (mutates; the fit is refreshed lazily)."""
        if len(x) != self.num_features:
            raise ValueError(f"expected {self.num_features} features, got {len(x)}")
        self._xs.append(tuple(float(v) for v in x))
        self._ys.append(float(y))
        self._since_fit += 1

    @property
    def num_samples(self) -> int:
        """Samples in the window."""
        return len(self._ys)

    def ready(self) -> bool:
        """Enough samples, spread over enough distinct values of the first feature, to extrapolate."""
        return (self.num_samples >= self.min_samples
                and len({x[0] for x in self._xs}) >= self.min_distinct_x0)

    def coefficients(self) -> np.ndarray | None:
        """[intercept, slopes...], refit if stale and the window allows; the last fit is kept while the
        window lacks spread (a steady batch size teaches nothing new); None before the first fit."""
        if not self.ready():
            return self._coef
        if self._coef is None or self._since_fit >= self.refit_every:
            self._coef = self._fit()
            self._since_fit = 0
        return self._coef

    def predict(self, x: Sequence[float]) -> float | None:
        """Predicted y at `x`, or None before the first fit."""
        coef = self.coefficients()
        if coef is None:
            return None
        return float(coef[0] + np.dot(coef[1:], np.asarray(x, dtype=float)))

    def snapshot(self) -> FitSnapshot:
        """Current coefficients (read-only apart from a lazy refit)."""
        coef = self.coefficients()
        if coef is None:
            return FitSnapshot(None, None, self.num_samples)
        return FitSnapshot(float(coef[0]), tuple(float(c) for c in coef[1:]), self.num_samples)

    def _fit(self) -> np.ndarray:
        x = np.column_stack([np.ones(self.num_samples), np.asarray(self._xs, dtype=float)])
        y = np.asarray(self._ys, dtype=float)
        age = np.arange(self.num_samples - 1, -1, -1, dtype=float)
        decay = 0.5 ** (age / self.half_life)
        active = np.ones(x.shape[1], dtype=bool)
        while True:  # slopes are non-negative by physics (more work never takes less time): drop any
            coef = np.zeros(x.shape[1])  # that the data would make negative and refit without it
            coef[active] = _huber_fit(x[:, active], y, decay)
            negative = active & (coef < 0)
            negative[0] = False
            if not negative.any():
                return coef
            active &= ~negative


def _huber_fit(x: np.ndarray, y: np.ndarray, decay: np.ndarray) -> np.ndarray:
    weights = decay.copy()
    coef = np.zeros(x.shape[1])
    for _ in range(_IRLS_PASSES):
        coef = _weighted_ridge(x, y, weights)
        resid = y - x @ coef
        scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) or 1e-9
        ratio = np.abs(resid) / (_HUBER_K * scale)
        weights = decay * np.where(ratio <= 1.0, 1.0, 1.0 / np.maximum(ratio, 1e-12))
    return coef


def _weighted_ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    xw = x * w[:, None]
    gram = x.T @ xw
    penalty = _RIDGE * np.trace(gram) / gram.shape[0] * np.eye(gram.shape[0])
    penalty[0, 0] = 0.0  # never shrink the intercept
    return np.linalg.solve(gram + penalty, xw.T @ y)


class StepTimeModel:
    """Seconds per decode step from running requests, running tokens (KV length) and local-prefill tokens."""

    def __init__(self, **fit_kwargs):
        self.fit = RobustLinearFit(num_features=3, **fit_kwargs)

    @staticmethod
    def features(num_running: int, num_tokens: int, num_local_tokens: int = 0) -> tuple[float, float, float]:
        """(requests, tokens / 1000, local-prefill tokens / 1000): slopes of comparable magnitudes."""
        return float(num_running), num_tokens / 1000.0, num_local_tokens / 1000.0

    def add(self, num_running: int, num_tokens: int, step_s: float, num_local_tokens: int = 0) -> None:
        """Record one measured step, with the local-prefill tokens run inside it (mutates)."""
        self.fit.add(self.features(num_running, num_tokens, num_local_tokens), step_s)

    def predict(self, num_running: int, num_tokens: int, num_local_tokens: int = 0) -> float | None:
        """Predicted seconds for a step of this batch (plus a local extend of that many tokens); None until ready."""
        return self.fit.predict(self.features(num_running, num_tokens, num_local_tokens))

    def ready(self) -> bool:
        """True once there is a fit to predict with (see RobustLinearFit.coefficients)."""
        return self.fit.coefficients() is not None
