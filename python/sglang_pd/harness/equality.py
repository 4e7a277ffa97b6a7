"""Is one greedy output the same as another? Token ids, and the logprobs behind each token.

Two /generate bodies (SGLang's JSON: `output_ids`, and with `return_logprob` + `top_logprobs_num` in
`meta_info`: `output_token_logprobs` [(logprob, token id, text)] and `output_top_logprobs`, one top-k
list per output token) are the same output when:
- the token ids are equal, and
- at every position the chosen token's logprob, and the top-k logprobs (sorted values, position by
  position), differ by at most LOGPROB_TOL.

LOGPROB_TOL = 1e-4: both sides run the same fp32 CPU model, but not the same arithmetic (another
batch size in the linear layers, attention split by shared prefix and merged, a page moved by
transfer instead of computed in place); those differences measured up to ~1e-5 in logprob here
(`max_logprob_diff` of every comparison is kept: `python -m pytest ... -s` prints it). A wrong KV page
moves the logprobs by 1e-2 and more on the built-in models (docs/results/evidence/sensitivity.json).

A greedy tie: when the two top logprobs at a position are within LOGPROB_TOL of each other, fp32
rounding may pick either, and the continuations then differ for good. Such a difference (everything
before it equal within tolerance) is a `tie_flip`: not `same`, but not a defect either. `assert_same`
lets it pass and counts it (`TALLY`, printed at the end of a test session with the number of
comparisons); `assert_differs` (a power check) does not count a tie flip as the difference it wants.
"""

from __future__ import annotations

from dataclasses import dataclass

LOGPROB_TOL = 1e-4
TOP_K = 5


def logprob_fields(top_k: int = TOP_K) -> dict:
    """Request fields that make SGLang return the output logprobs `compare` reads (prompt logprobs off:
    logprob_start_len -1, which a decode server never returns and decode-local prefill refuses)."""
    return {"return_logprob": True, "top_logprobs_num": top_k, "logprob_start_len": -1}


@dataclass(frozen=True)
class Comparison:
    """The outcome of `compare(actual, expected)`."""

    num_tokens: int                 # expected's output length
    first_token_diff: int | None    # first position whose token differs (None: all equal, lengths too)
    first_logprob_diff: int | None  # first position whose logprobs differ by more than LOGPROB_TOL
    max_logprob_diff: float | None  # over the positions compared (None: no logprobs on one side)
    tie_flip: bool                  # the first token difference is at a greedy tie (see module docstring)

    @property
    def same(self) -> bool:
        """Same tokens, and logprobs within LOGPROB_TOL wherever both sides carry them."""
        return self.first_token_diff is None and self.first_logprob_diff is None

    def describe(self) -> str:
        """One line: same (with the largest logprob difference) or where the outputs first differ."""
        if self.same:
            return f"same {self.num_tokens} tokens (max |d logprob| {self.max_logprob_diff})"
        return (f"differ: first token diff at {self.first_token_diff}, first logprob diff at {self.first_logprob_diff}"
                f", max |d logprob| {self.max_logprob_diff}, tie flip {self.tie_flip}")


def _logprobs(body: dict) -> tuple[list[float], list[list[float]], list[list[int]]] | None:
    meta = body.get("meta_info") or {}
    chosen, top = meta.get("output_token_logprobs"), meta.get("output_top_logprobs")
    if not chosen or not top:
        return None
    return ([float(c[0]) for c in chosen], [sorted((float(t[0]) for t in row), reverse=True) for row in top],
            [[int(t[1]) for t in row] for row in top])


def _tie_at(top_values: list[list[float]], position: int) -> bool:
    row = top_values[position] if position < len(top_values) else []
    return len(row) >= 2 and row[0] - row[1] <= LOGPROB_TOL


def compare(actual: dict, expected: dict) -> Comparison:
    """Compare two /generate bodies (module docstring). Logprobs are compared at the positions both
    carry, up to the first token difference (after it the contexts differ)."""
    a_ids, e_ids = list(actual["output_ids"]), list(expected["output_ids"])
    first_token = next((i for i, (x, y) in enumerate(zip(a_ids, e_ids)) if x != y),
                       None if len(a_ids) == len(e_ids) else min(len(a_ids), len(e_ids)))
    a_lp, e_lp = _logprobs(actual), _logprobs(expected)
    if a_lp is None or e_lp is None:
        return Comparison(len(e_ids), first_token, None, None, False)
    upto = min(len(a_lp[0]), len(e_lp[0]), len(e_ids) if first_token is None else first_token + 1)
    first_lp, worst = None, 0.0
    for i in range(upto):
        diffs = [abs(a_lp[0][i] - e_lp[0][i])] + [abs(x - y) for x, y in zip(a_lp[1][i], e_lp[1][i])]
        worst = max(worst, *diffs)
        if first_lp is None and max(diffs) > LOGPROB_TOL:
            first_lp = i
    tie = (first_token is not None and first_token < min(len(a_ids), len(e_ids))
           and (first_lp is None or first_lp >= first_token) and _tie_at(e_lp[1], first_token))
    return Comparison(len(e_ids), first_token, first_lp, worst, tie)


class TieFlips:
    """Counts comparisons and the tie flips among them (tests and benchmarks report both)."""

    def __init__(self):
        self.num_compared = 0
        self.num_tie_flips = 0
        self.max_logprob_diff = 0.0

    def add(self, comparison: Comparison) -> Comparison:
        """Count `comparison`; returns it."""
        self.num_compared += 1
        self.num_tie_flips += comparison.tie_flip
        if comparison.max_logprob_diff is not None:
            self.max_logprob_diff = max(self.max_logprob_diff, comparison.max_logprob_diff)
        return comparison


TALLY = TieFlips()  # every comparison `assert_same` made in this process


def assert_same(actual: dict, expected: dict, what: str = "") -> Comparison:
    """Raise AssertionError unless `actual` is the same output as `expected` (Comparison.same) or differs
    from it only past a greedy tie (counted in TALLY); the message names the first difference."""
    comparison = TALLY.add(compare(actual, expected))
    assert comparison.same or comparison.tie_flip, \
        f"{what}: {comparison.describe()}: {actual['output_ids']} vs {expected['output_ids']}"
    return comparison


def assert_differs(actual: dict, expected: dict, what: str = "") -> Comparison:
    """Raise AssertionError if `actual` is the same output as `expected`, or differs only by a greedy tie
    (a power check: the path under test was broken on purpose and the output must show it)."""
    comparison = compare(actual, expected)
    assert not comparison.same and not comparison.tie_flip, f"{what}: the broken path was not seen: {comparison.describe()}"
    return comparison
