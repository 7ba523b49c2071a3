"""SecAgg+ degree k and threshold t from the threat model, for our random Harary ring.

Bell et al. ("Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020) show
that SecAgg run on a sparse random graph G is as secure as SecAgg on the complete graph when G,
the threshold t and the adversary's budget make three bad events unlikely. For any set C of at most
gamma N corrupt clients and any set D of at most delta N dropouts (both fixed independently of the
random graph), they require (paraphrased; the structure of their conditions on a "good" graph, not
their numbering or wording):

1. security, no honest client has t corrupt share holders: P[some honest u has >= t corrupt
   neighbours] is negligible (2^-sigma); otherwise the server and the colluders rebuild both b_u and
   s_sk_u (one from the honest holders' answers, the other from the colluders) and unmask x_u;
2. security, the honest survivors stay connected: P[G restricted to the honest survivors
   (not in C, not in D) is disconnected] is negligible (2^-sigma); otherwise the server, which
   knows every mask that involves a colluder and rebuilds those of dropped clients, learns the sum
   of each component separately instead of only the total;
3. correctness, every secret the server needs has t live holders: P[some client whose secret is
   needed at unmasking has fewer than t live share holders] <= 2^-eta; otherwise the round aborts.

Our graph (`secagg.graph.harary_graph`) places the clients on a ring in a uniformly random order and
links each to the k/2 positions on either side. For one client u, its k neighbours are therefore a
uniformly random k-subset of the other N - 1 clients, so every per-client count below is exactly
hypergeometric. `plus_parameters` checks, with a union bound over the clients (natural logs inside,
log2 reported), writing HG(M, K, k) for the number of marked clients among k drawn without
replacement from M of which K are marked, c = ceil(gamma N) corrupt clients and
m = min(N, ceil(delta N) + c) clients that are not live at unmasking (dropouts, and colluders, which
may refuse to answer: "delta + gamma"):

* security (1):     P_sec(t)  = (N - c) * P[HG(N - 1, c, k) >= t]                  (honest clients)
* connectivity (2): P_conn    = N * C(m, k/2) / C(N, k/2)
  Two honest survivors that follow each other on the ring (no honest survivor between them) are
  linked unless k/2 or more positions separate them, so a disconnection needs (at least) one window
  of k/2 consecutive positions without an honest survivor; there are N windows and each lies
  entirely in the m non-honest-survivors with probability C(m, k/2) / C(N, k/2). (A disconnection in
  fact needs two such disjoint windows, so this over-counts; conservative.) We hold it to 2^-sigma, not
  2^-eta, because it is a privacy failure, not an abort: the server's own connectivity check runs
  over all survivors, colluders included, and cannot see it. Conditions 1 and 2 share the budget:
  P_sec(t) + P_conn <= 2^-sigma.
* correctness (3):  P_abort(t) = (N - m) * P[HG(N - 1, m, k) >= k + 2 - t]
                               +  m      * P[HG(N - 1, m - 1, k) >= k + 1 - t] + P_conn  <= 2^-eta.
  A live client holds one share itself (1 + k - X live holders; it fails when X >= k + 2 - t); a
  client that left after sending its shares (its masking key must be rebuilt) or a colluder that
  sent its masked input but refuses to answer (its self-mask seed must be rebuilt) does not count
  itself (k - X holders). The last term bounds the server's own abort on a disconnected survivor
  graph (the dropouts are among the m).
* the client-side rule already in the protocol: t > (k + 1) / 2, i.e. t >= k/2 + 1 for even k (a
  client refuses a lower t: a server lying about who dropped could otherwise collect both its
  self-mask seed and its masking key). Hard constraint; it is what makes k grow fast with
  delta + gamma, since correctness then needs more than half of each neighbourhood live.
* k <= N - 1; the complete graph (plain SecAgg, k = N - 1) is deterministic: it needs
  c < t <= N - m with t > N / 2.

The returned degree is the smallest even k < N - 1 meeting all of them, with the smallest t that
does (security improves with t, correctness worsens, so the smallest secure t is the best for
correctness); failing every such k, the complete graph (`complete=True`); failing that, ValueError.

Mapping to Bell et al.: their analysis bounds these events for their random graph with tail bounds;
here the same three events are computed exactly (hypergeometric tails, union bounds) for our Harary
ring, with events 1 and 2 sharing the 2^-sigma budget (Google's open-source Harary parameter finder
for SecAgg+ splits sigma over the same two events). Their variant against a server that lies about
dropouts to different clients needs more: fewer than 2t - (k + 1) corrupt neighbours (the server
must collect t shares of b_u and t of s_sk_u, and each honest holder gives only one of the two);
that is not checked here (the toolkit's threat model is an honest-but-curious server; see
docs/threat_model.md), beyond the majority rule, which is that condition with no colluders.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

__all__ = ["PlusParameters", "DegreeCheck", "check_degree", "plus_parameters", "counts",
           "corrupt_neighbour_tail", "short_holder_probability", "window_probability"]

_LN2 = math.log(2.0)
_FUZZ = 1e-9   # 0.3 * 1000 is 300.00000000000006: do not round that up to 301


def counts(*, n: int, dropout: float, corrupt_fraction: float) -> tuple[int, int]:
    """(c, m): corrupt clients ceil(gamma N) and clients not live at unmasking min(N, ceil(delta N) + c)."""
    c = min(n, math.ceil(corrupt_fraction * n - _FUZZ))
    d = min(n, math.ceil(dropout * n - _FUZZ))
    return c, min(n, c + d)


def _log_comb(a: int, b: int) -> float:
    if b < 0 or b > a:
        return -math.inf
    return float(gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1))


def _log_upper_tails(population: int, marked: int, draws: int) -> np.ndarray:
    """T[x] = ln P[HG(population, marked, draws) >= x] for x = 0 .. draws + 1 (exact, log space)."""
    x = np.arange(draws + 1)
    lo, hi = max(0, draws - (population - marked)), min(draws, marked)
    logpmf = np.full(draws + 1, -np.inf)
    s = x[lo:hi + 1]
    logpmf[lo:hi + 1] = (gammaln(marked + 1) - gammaln(s + 1) - gammaln(marked - s + 1)
                         + gammaln(population - marked + 1) - gammaln(draws - s + 1)
                         - gammaln(population - marked - draws + s + 1)
                         - (gammaln(population + 1) - gammaln(draws + 1) - gammaln(population - draws + 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        tails = np.logaddexp.accumulate(logpmf[::-1])[::-1]
    tails = np.minimum(tails, 0.0)
    return np.append(tails, -np.inf)


def _tail(tails: np.ndarray, x: int) -> float:
    """ln P[X >= x] from `_log_upper_tails` (x may fall outside 0 .. draws + 1)."""
    if x <= 0:
        return 0.0
    return float(tails[min(x, len(tails) - 1)])


def _log_window(n: int, degree: int, lost: int) -> float:
    """ln of N * P[a fixed window of k/2 consecutive ring positions holds only the `lost` clients]."""
    half = degree // 2
    if degree >= n - 1 or n - lost <= 0:
        return -math.inf   # complete graph: the survivors are always connected (or there are none)
    return math.log(n) + _log_comb(lost, half) - _log_comb(n, half)


# ---- per-client probabilities (exact; also what the tests compare with a simulation) -------------
def corrupt_neighbour_tail(*, n: int, degree: int, corrupt: int, threshold: int) -> float:
    """P[an honest client has >= threshold corrupt clients among its `degree` neighbours]."""
    return math.exp(_tail(_log_upper_tails(n - 1, corrupt, degree), threshold))


def short_holder_probability(*, n: int, degree: int, lost: int, threshold: int, live: bool) -> float:
    """P[a client has fewer than `threshold` live share holders] when `lost` of the N clients are not
    live: a live client counts itself (1 + k - X holders), a client that is not live does not (k - X)."""
    if live:
        return math.exp(_tail(_log_upper_tails(n - 1, lost, degree), degree + 2 - threshold))
    return math.exp(_tail(_log_upper_tails(n - 1, lost - 1, degree), degree + 1 - threshold))


def window_probability(*, n: int, degree: int, lost: int) -> float:
    """P[a fixed window of k/2 consecutive ring positions holds only clients from a set of `lost`]."""
    return math.exp(_log_comb(lost, degree // 2) - _log_comb(n, degree // 2))


# ---- the search -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DegreeCheck:
    """The outcome of checking one degree: the smallest threshold meeting every condition, or None
    and the condition that fails (`reason`). Bounds are log2 of the union bounds at that threshold
    (at the smallest threshold the majority and security rules allow, when there is none)."""

    degree: int
    threshold: int | None
    security_failure_log2: float
    abort_log2: float
    reason: str = ""


def _log2(x: float) -> float:
    return x / _LN2


def check_degree(*, n: int, degree: int, dropout: float, corrupt_fraction: float, sigma: float = 40.0,
                 eta: float = 30.0) -> DegreeCheck:
    """Check every condition of the module docstring for one degree k (k >= N - 1: the complete graph)."""
    k = min(degree, n - 1)
    c, m = counts(n=n, dropout=dropout, corrupt_fraction=corrupt_fraction)
    sec_budget, abort_budget = -sigma * _LN2, -eta * _LN2
    conn = _log_window(n, k, m)
    corrupt_tails = _log_upper_tails(n - 1, c, k)
    live_tails = _log_upper_tails(n - 1, m, k)
    gone_tails = _log_upper_tails(n - 1, max(m - 1, 0), k)

    def security(t: int) -> float:
        honest = math.log(n - c) if n > c else -math.inf
        return float(np.logaddexp(honest + _tail(corrupt_tails, t), conn))

    def abort(t: int) -> float:
        live = math.log(n - m) + _tail(live_tails, k + 2 - t) if n > m else -math.inf
        gone = math.log(m) + _tail(gone_tails, k + 1 - t) if m > 0 else -math.inf
        return float(np.logaddexp(np.logaddexp(live, gone), conn))

    t_majority = (k + 1) // 2 + 1          # the smallest t > (k + 1) / 2
    if conn > sec_budget:
        return DegreeCheck(k, None, _log2(security(t_majority)), _log2(abort(t_majority)),
                           f"connectivity of the honest survivors: N * P[a window of k/2 = {k // 2} positions "
                           f"holds only the {m} dropped or corrupt clients] = 2^{_log2(conn):.1f} > 2^-{sigma:g}")
    t = t_majority
    while t <= k + 1 and security(t) > sec_budget:
        t += 1
    if t > k + 1:
        return DegreeCheck(k, None, _log2(security(k + 1)), _log2(abort(k + 1)),
                           f"security: an honest client may have {k + 1} corrupt share holders "
                           f"(P = 2^{_log2(security(k + 1)):.1f} > 2^-{sigma:g}) even at t = k + 1")
    if abort(t) > abort_budget:
        binding = "the majority rule t > (k+1)/2" if t == t_majority else f"security (t >= {t})"
        return DegreeCheck(k, None, _log2(security(t)), _log2(abort(t)),
                           f"correctness with {binding}: at t = {t}, P[some needed secret has fewer than t live "
                           f"holders among {m} dropped or corrupt] = 2^{_log2(abort(t)):.1f} > 2^-{eta:g}")
    return DegreeCheck(k, t, _log2(security(t)), _log2(abort(t)))


@dataclass(frozen=True)
class PlusParameters:
    """SecAgg+ parameters for one round: the masking graph's degree and the Shamir threshold."""

    n: int
    degree: int
    threshold: int
    dropout: float
    corrupt_fraction: float
    sigma: float
    eta: float
    security_failure_log2: float
    """log2 of the union bound on a security failure (t corrupt holders, or honest survivors cut apart)."""
    abort_log2: float
    """log2 of the union bound on an abort at the planned dropout (corrupt clients refusing included)."""
    complete: bool
    """True when no sparse graph works: degree = n - 1, the complete graph, i.e. plain SecAgg."""

    def threshold_fraction(self) -> float:
        """The `threshold_fraction` for which SecAggPlusServer's floor(f (k + 1)) + 1 is exactly t."""
        return (self.threshold - 0.5) / (self.degree + 1)

    def describe(self) -> str:
        """One line to print with each round."""
        graph = " (complete graph: SecAgg)" if self.complete else ""

        def bound(log2: float) -> str:
            return "0" if log2 == -math.inf else f"2^{log2:.1f}"

        return (f"secagg+ n={self.n} k={self.degree} t={self.threshold}{graph} dropout={self.dropout:.2f} "
                f"corrupt={self.corrupt_fraction:.2f} sigma={self.sigma:g} eta={self.eta:g} "
                f"security<={bound(self.security_failure_log2)} abort<={bound(self.abort_log2)}")


def plus_parameters(*, n: int, dropout: float, corrupt_fraction: float = 0.05, sigma: float = 40.0,
                    eta: float = 30.0) -> PlusParameters:
    """The smallest even degree k (and smallest threshold t for it) meeting every condition of the
    module docstring for N = n clients, planned dropout fraction delta = `dropout` and colluding
    fraction gamma = `corrupt_fraction`; the complete graph if only it does; ValueError if none does."""
    if n < 2:
        raise ValueError(f"need at least 2 clients, got n={n}")
    if not (0.0 <= dropout < 1.0 and 0.0 <= corrupt_fraction < 1.0):
        raise ValueError(f"dropout and corrupt_fraction must be in [0, 1), got {dropout}, {corrupt_fraction}")
    if not (sigma > 0 and eta > 0):
        raise ValueError(f"sigma and eta must be positive, got {sigma}, {eta}")
    found: DegreeCheck | None = None
    for k in range(2, n - 1, 2):
        check = check_degree(n=n, degree=k, dropout=dropout, corrupt_fraction=corrupt_fraction, sigma=sigma, eta=eta)
        if check.threshold is not None:
            found = check
            break
    complete = found is None
    if found is None:
        found = check_degree(n=n, degree=n - 1, dropout=dropout, corrupt_fraction=corrupt_fraction, sigma=sigma,
                             eta=eta)
        if found.threshold is None:
            c, m = counts(n=n, dropout=dropout, corrupt_fraction=corrupt_fraction)
            raise ValueError(
                f"no SecAgg+ degree k <= N-1 for n={n}, dropout={dropout}, corrupt_fraction={corrupt_fraction} "
                f"({c} corrupt, {m} not live): even the complete graph fails; binding condition: {found.reason}")
    assert found.threshold is not None
    return PlusParameters(n=n, degree=found.degree, threshold=found.threshold, dropout=dropout,
                          corrupt_fraction=corrupt_fraction, sigma=sigma, eta=eta,
                          security_failure_log2=found.security_failure_log2, abort_log2=found.abort_log2,
                          complete=complete)
