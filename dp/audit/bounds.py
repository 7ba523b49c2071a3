"""Empirical epsilon from canary scores: two lower bounds with stated confidence, and one estimate.

Scores are larger for canaries that were inserted ("in") than for canaries that were not ("out").
Everything here is pure statistics on those scores; `dp.audit.federated` and `dp.audit.one_run`
produce them.

* `clopper_pearson_bound` (the headline lower bound). A threshold t is chosen on a SELECTION split
  of the canaries (the one maximising the bound there), then on the disjoint EVALUATION split
      TPR_lo = Clopper-Pearson lower bound of P[score > t | in]   at level alpha/2 (one-sided)
      FPR_hi = Clopper-Pearson upper bound of P[score > t | out]  at level alpha/2 (one-sided)
      eps_lb = max(0, ln((TPR_lo - delta) / FPR_hi))
  For an (eps, delta)-DP mechanism every test has TPR <= e^eps FPR + delta, so eps_lb <= eps with
  probability >= 1 - alpha (union bound over the two intervals), provided the evaluation scores
  are independent trials (see `dp.audit.federated` for when that holds and when it is approximate).
  The largest value these counts allow (TPR = 1 and FPR = 0 observed) is `max_lower_bound`.
* `one_run_bound` (Steinke, Nasr and Jagielski, "Privacy auditing with one (1) training run",
  NeurIPS 2023, Thm. 3 / App. D). m canaries, each included independently with probability 1/2;
  guess the k+ highest scores "in" and the k- lowest "out"; with r = k+ + k- guesses of which v are
  right, the p-value of (eps, delta)-DP is
      p(eps) = P[Bin(r, q) >= v] + 2 m delta max_{i=1..v} P[v > Bin(r, q) >= v - i] / i,
      q = e^eps / (1 + e^eps),
  and the bound is the largest eps with p(eps) <= alpha. Valid for ANY dependence between the
  canaries' scores (only the inclusion coins are random); a Bonferroni correction covers the grid
  of (k+, k-) tried.
* `gaussian_fit_epsilon` (Andrew et al., "One-shot empirical privacy estimation for federated
  learning", ICLR 2024): fit N(mu_in, s_in^2) and N(mu_out, s_out^2) to the two score sets and
  report the epsilon at delta of the pair of Gaussians (the Gaussian-mechanism epsilon when the
  variances agree). An ESTIMATE, not a bound: no confidence is claimed.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats

DEFAULT_CONFIDENCE = 0.95
_EPS_CAP = 200.0
"""Largest epsilon the root finders search (beyond it a bound is reported as this cap)."""


def _check_confidence(confidence: float) -> float:
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    return 1.0 - confidence


def _check_delta(delta: float) -> None:
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")


# ---- Clopper-Pearson ---------------------------------------------------------------------------

def clopper_pearson_lower(successes: np.ndarray | int, trials: int, alpha: float) -> np.ndarray:
    """One-sided lower confidence bound (level 1 - alpha) of a binomial proportion (0 with no success)."""
    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.ppf(alpha, np.maximum(k, 1.0), trials - k + 1.0)
    return np.where(k > 0, out, 0.0)


def clopper_pearson_upper(successes: np.ndarray | int, trials: int, alpha: float) -> np.ndarray:
    """One-sided upper confidence bound (level 1 - alpha) of a binomial proportion (1 when all succeed)."""
    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(trials - k, 1.0))
    return np.where(k < trials, out, 1.0)


def epsilon_from_rates(*, tpr_lower: np.ndarray | float, fpr_upper: np.ndarray | float,
                       delta: float) -> np.ndarray:
    """max(0, ln((TPR_lo - delta) / FPR_hi)): the epsilon a test with these rates rules out."""
    tpr, fpr = np.asarray(tpr_lower, dtype=np.float64), np.asarray(fpr_upper, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(np.maximum(tpr - delta, 0.0)) - np.log(fpr)
    return np.where(np.isfinite(eps) & (eps > 0), eps, 0.0)


def max_lower_bound(*, n_in: int, n_out: int, delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The largest Clopper-Pearson bound `n_in` in and `n_out` out canaries can give (perfect separation)."""
    alpha = _check_confidence(confidence)
    if n_in < 1 or n_out < 1:
        return 0.0
    return float(epsilon_from_rates(tpr_lower=clopper_pearson_lower(n_in, n_in, alpha / 2),
                                    fpr_upper=clopper_pearson_upper(0, n_out, alpha / 2), delta=delta))


@dataclass(frozen=True)
class ClopperPearsonBound:
    """The headline lower bound: its threshold, statistic and the counts it rests on."""

    epsilon: float
    """Lower bound on epsilon at `delta`, holding with probability `confidence` (0 = nothing shown)."""
    statistic: str
    threshold: float
    """Canaries scoring above this are guessed "in" (chosen on the selection split)."""
    true_positives: int
    false_positives: int
    n_in: int
    n_out: int
    """Evaluation-split counts of inserted and held-out canaries."""
    tpr_lower: float
    fpr_upper: float
    delta: float
    confidence: float
    max_epsilon: float
    """The largest bound these evaluation counts allow (`max_lower_bound`)."""
    selection_epsilon: float
    """The (pessimistic) bound that chose the threshold on the selection split: not the reported bound."""

    def to_dict(self) -> dict:
        return asdict(self)


def _bounds_at(in_scores: np.ndarray, out_scores: np.ndarray, thresholds: np.ndarray, *, delta: float,
               alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(eps_lb, TP, FP, TPR_lo, FPR_hi) of the tests 'score > t' for every t in `thresholds`."""
    s_in, s_out = np.sort(in_scores), np.sort(out_scores)
    tp = s_in.size - np.searchsorted(s_in, thresholds, side="right")
    fp = s_out.size - np.searchsorted(s_out, thresholds, side="right")
    tpr = clopper_pearson_lower(tp, s_in.size, alpha / 2)
    fpr = clopper_pearson_upper(fp, s_out.size, alpha / 2)
    return epsilon_from_rates(tpr_lower=tpr, fpr_upper=fpr, delta=delta), tp, fp, tpr, fpr


def _robust_selection_bounds(in_scores: np.ndarray, out_scores: np.ndarray, thresholds: np.ndarray, *,
                             delta: float, alpha: float) -> np.ndarray:
    """The bound of each threshold with its selection counts moved one standard error the wrong way
    (TP - sqrt(TP), FP + sqrt(FP) + 1): the threshold chosen then keeps its bound on fresh canaries,
    instead of sitting in a tail where a few lucky counts made it look best. Only the choice uses this."""
    s_in, s_out = np.sort(in_scores), np.sort(out_scores)
    tp = (s_in.size - np.searchsorted(s_in, thresholds, side="right")).astype(np.float64)
    fp = (s_out.size - np.searchsorted(s_out, thresholds, side="right")).astype(np.float64)
    tp, fp = np.maximum(tp - np.sqrt(tp), 0.0), np.minimum(fp + np.sqrt(fp) + 1.0, s_out.size)
    return epsilon_from_rates(tpr_lower=clopper_pearson_lower(tp, s_in.size, alpha / 2),
                              fpr_upper=clopper_pearson_upper(fp, s_out.size, alpha / 2), delta=delta)


def _candidate_thresholds(in_scores: np.ndarray, out_scores: np.ndarray) -> np.ndarray:
    """The thresholds worth trying: just below each inserted canary's score, at the middle of the gap
    to the next lower score (raising a threshold past held-out scores only lowers FP, so the best test
    always sits just below an inserted score; the middle of the gap transfers to fresh canaries)."""
    pooled = np.unique(np.concatenate([in_scores, out_scores]))
    if pooled.size == 0:
        return np.array([0.0])
    at = np.flatnonzero(np.isin(pooled, in_scores))
    lower = np.where(at > 0, pooled[np.maximum(at - 1, 0)], pooled[0] - 2.0)
    return (lower + pooled[at]) / 2


def clopper_pearson_bound(*, selection: Mapping[str, tuple[np.ndarray, np.ndarray]],
                          evaluation: Mapping[str, tuple[np.ndarray, np.ndarray]], delta: float,
                          confidence: float = DEFAULT_CONFIDENCE) -> ClopperPearsonBound:
    """The Clopper-Pearson lower bound (module doc): the statistic and threshold maximising it on
    `selection` ({statistic: (in scores, out scores)}), evaluated once on `evaluation` (same keys,
    disjoint canaries). Only the evaluation split enters the reported bound."""
    alpha = _check_confidence(confidence)
    _check_delta(delta)
    if set(selection) != set(evaluation) or not selection:
        raise ValueError("selection and evaluation must name the same (non-empty) statistics")
    best = None
    for name in sorted(selection):
        s_in, s_out = (np.asarray(a, dtype=np.float64) for a in selection[name])
        if s_in.size == 0 or s_out.size == 0:
            raise ValueError(f"statistic {name!r}: the selection split needs inserted and held-out canaries")
        ts = _candidate_thresholds(s_in, s_out)
        robust = _robust_selection_bounds(s_in, s_out, ts, delta=delta, alpha=alpha)
        if robust.max() <= 0:  # nothing survives the pessimism: fall back to the plain bound
            robust = _bounds_at(s_in, s_out, ts, delta=delta, alpha=alpha)[0]
        top = np.flatnonzero(robust == robust.max())
        i = top[len(top) // 2]  # ties: the middle of the tied thresholds
        if best is None or robust[i] > best[0]:
            best = (float(robust[i]), name, float(ts[i]))
    selection_eps, name, t = best
    e_in, e_out = (np.asarray(a, dtype=np.float64) for a in evaluation[name])
    if e_in.size == 0 or e_out.size == 0:
        raise ValueError(f"statistic {name!r}: the evaluation split needs inserted and held-out canaries")
    eps, tp, fp, tpr, fpr = _bounds_at(e_in, e_out, np.array([t]), delta=delta, alpha=alpha)
    return ClopperPearsonBound(epsilon=float(eps[0]), statistic=name, threshold=t, true_positives=int(tp[0]),
                               false_positives=int(fp[0]), n_in=int(e_in.size), n_out=int(e_out.size),
                               tpr_lower=float(tpr[0]), fpr_upper=float(fpr[0]), delta=delta, confidence=confidence,
                               max_epsilon=max_lower_bound(n_in=e_in.size, n_out=e_out.size, delta=delta,
                                                           confidence=confidence),
                               selection_epsilon=selection_eps)


# ---- one run (Steinke, Nasr, Jagielski) --------------------------------------------------------

def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """p-value of 'the mechanism is (epsilon, delta)-DP' given `correct` of `guesses` right guesses
    about `canaries` canaries each included with probability 1/2 (Steinke et al., App. D)."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {canaries}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    _check_delta(delta)
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(correct - 1, guesses, q))  # P[Bin(r, q) >= v]
    if delta == 0 or correct == 0:
        return min(beta, 1.0)
    i = np.arange(1, correct + 1)
    between = stats.binom.sf(correct - i - 1, guesses, q) - beta  # P[v > Bin(r, q) >= v - i]
    return float(min(beta + 2 * canaries * delta * float(np.max(between / i)), 1.0))


def one_run_epsilon(*, canaries: int, guesses: int, correct: int, delta: float,
                    confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The largest epsilon whose (epsilon, delta)-DP the guesses reject at level 1 - confidence (0: none)."""
    alpha = _check_confidence(confidence)

    def excess(eps: float) -> float:
        return one_run_p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=eps, delta=delta) - alpha

    if guesses == 0 or excess(0.0) > 0:
        return 0.0
    return _crossing(excess, at_cap=_EPS_CAP, xtol=1e-6)


def _crossing(f, *, at_cap: float, xtol: float) -> float:
    """The epsilon in (0, hi] where f changes sign from its sign at 0, hi doubled from 1 until it does
    (`at_cap` if it has not by _EPS_CAP): the one root search both bounds need."""
    positive_at_zero = f(0.0) > 0
    hi = 1.0
    while (f(hi) > 0) == positive_at_zero:
        if hi >= _EPS_CAP:
            return at_cap
        hi *= 2
    return float(optimize.brentq(f, 0.0, hi, xtol=xtol))


@dataclass(frozen=True)
class OneRunBound:
    epsilon: float
    """Lower bound on epsilon at `delta`, with probability `confidence` (Bonferroni over the grid)."""
    k_pos: int
    k_neg: int
    guesses: int
    correct: int
    canaries: int
    delta: float
    confidence: float
    grid: int
    """How many (k+, k-) pairs were tried (the Bonferroni factor)."""

    def to_dict(self) -> dict:
        return asdict(self)


def default_guess_grid(canaries: int) -> tuple[tuple[int, int], ...]:
    """(k+, k-) pairs tried by default: k+ in {1, 2, 5, 10, 20, 50}% of m, k- = 0 or k+."""
    out = []
    for frac in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5):
        k = max(1, int(round(frac * canaries)))
        out += [(k, 0), (k, k)] if 2 * k <= canaries else [(k, 0)]
    return tuple(dict.fromkeys(out))


def one_run_bound(scores: np.ndarray, included: np.ndarray, *, delta: float,
                  confidence: float = DEFAULT_CONFIDENCE,
                  grid: Sequence[tuple[int, int]] | None = None) -> OneRunBound:
    """Steinke et al.'s one-run bound: for each (k+, k-) guess the k+ highest scores in and the k-
    lowest out; the best bound over the grid at level alpha / len(grid). `included` are the
    canaries' inclusion coins, which must have been fair and independent."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError("scores and included must be 1-D arrays of the same length")
    m = scores.size
    grid = tuple(grid) if grid is not None else default_guess_grid(m)
    if not grid or any(kp < 0 or kn < 0 or kp + kn > m for kp, kn in grid):
        raise ValueError("every (k+, k-) needs k+ + k- <= the number of canaries")
    alpha = _check_confidence(confidence)
    level = 1.0 - alpha / len(grid)
    order = np.argsort(-scores, kind="stable")
    best = OneRunBound(0.0, 0, 0, 0, 0, m, delta, confidence, len(grid))
    for kp, kn in grid:
        right = int(included[order[:kp]].sum()) + (int((~included[order[m - kn:]]).sum()) if kn else 0)
        eps = one_run_epsilon(canaries=m, guesses=kp + kn, correct=right, delta=delta, confidence=level)
        if eps > best.epsilon:
            best = OneRunBound(eps, kp, kn, kp + kn, right, m, delta, confidence, len(grid))
    return best


# ---- Gaussian fit (Andrew et al.) --------------------------------------------------------------

def _hockey_stick(eps: float, mu_p: float, s_p: float, mu_q: float, s_q: float) -> float:
    """sup_A P(A) - e^eps Q(A) for P = N(mu_p, s_p^2), Q = N(mu_q, s_q^2): A = {ln p/q > eps}, a
    region bounded by the roots of a quadratic."""
    a = 1 / (2 * s_q**2) - 1 / (2 * s_p**2)
    b = mu_p / s_p**2 - mu_q / s_q**2
    c = mu_q**2 / (2 * s_q**2) - mu_p**2 / (2 * s_p**2) + math.log(s_q / s_p) - eps  # ln p/q - eps = a x^2 + b x + c

    def mass(mu: float, s: float, lo: float, hi: float) -> float:
        return float(stats.norm.cdf(hi, mu, s) - stats.norm.cdf(lo, mu, s)) if hi > lo else 0.0

    if abs(a) < 1e-12 * (1 / s_p**2 + 1 / s_q**2):  # equal variances: a half line
        if b == 0:
            return max(0.0, 1.0 - math.exp(eps)) if c > 0 else 0.0
        root = -c / b
        intervals = [(root, math.inf)] if b > 0 else [(-math.inf, root)]
    else:
        disc = b * b - 4 * a * c
        if disc <= 0:
            intervals = [(-math.inf, math.inf)] if a > 0 else []
        else:
            r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
            intervals = [(-math.inf, r1), (r2, math.inf)] if a > 0 else [(r1, r2)]
    p = sum(mass(mu_p, s_p, lo, hi) for lo, hi in intervals)
    q = sum(mass(mu_q, s_q, lo, hi) for lo, hi in intervals)
    return max(0.0, p - math.exp(eps) * q)


def gaussian_pair_delta(epsilon: float, *, mean_in: float, std_in: float, mean_out: float, std_out: float) -> float:
    """delta(epsilon) of the pair N(mean_in, std_in^2), N(mean_out, std_out^2) (both directions)."""
    return max(_hockey_stick(epsilon, mean_in, std_in, mean_out, std_out),
               _hockey_stick(epsilon, mean_out, std_out, mean_in, std_in))


def gaussian_pair_epsilon(*, mean_in: float, std_in: float, mean_out: float, std_out: float, delta: float) -> float:
    """The smallest epsilon with delta(epsilon) <= delta for the pair of Gaussians (inf beyond the search cap)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (std_in > 0 and std_out > 0):
        return 0.0 if mean_in == mean_out and std_in == std_out else math.inf

    def excess(eps: float) -> float:
        return gaussian_pair_delta(eps, mean_in=mean_in, std_in=std_in, mean_out=mean_out, std_out=std_out) - delta

    if excess(0.0) <= 0:
        return 0.0
    return _crossing(excess, at_cap=math.inf, xtol=1e-7)


@dataclass(frozen=True)
class GaussianFit:
    epsilon: float
    """Estimated epsilon at `delta` (no confidence claimed; inf = the fits do not overlap)."""
    mean_in: float
    std_in: float
    mean_out: float
    std_out: float
    delta: float
    n_in: int
    n_out: int

    def to_dict(self) -> dict:
        return asdict(self)


def gaussian_fit_epsilon(in_scores: np.ndarray, out_scores: np.ndarray, *, delta: float) -> GaussianFit:
    """Andrew et al.'s estimate: Gaussians fitted (mean, sample std) to the in and out scores, and
    the epsilon at `delta` of telling them apart."""
    s_in, s_out = np.asarray(in_scores, dtype=np.float64), np.asarray(out_scores, dtype=np.float64)
    if s_in.size < 2 or s_out.size < 2:
        raise ValueError("the Gaussian fit needs at least two inserted and two held-out scores")
    mi, si, mo, so = float(s_in.mean()), float(s_in.std(ddof=1)), float(s_out.mean()), float(s_out.std(ddof=1))
    eps = gaussian_pair_epsilon(mean_in=mi, std_in=si, mean_out=mo, std_out=so, delta=delta)
    return GaussianFit(eps, mi, si, mo, so, delta, int(s_in.size), int(s_out.size))


__all__ = ["DEFAULT_CONFIDENCE", "ClopperPearsonBound", "clopper_pearson_bound", "clopper_pearson_lower",
           "clopper_pearson_upper", "epsilon_from_rates", "max_lower_bound", "OneRunBound", "one_run_bound",
           "one_run_epsilon", "one_run_p_value", "default_guess_grid", "GaussianFit", "gaussian_fit_epsilon",
           "gaussian_pair_delta", "gaussian_pair_epsilon"]
