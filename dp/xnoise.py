"""Dropout-exact distributed DP: add-then-remove noise layers (Dordis's XNoise, EuroSys 2024).

Distributed DP sizes each client's noise for the floor n_min of honest survivors, so a round where
more survive carries more noise than the target (README: "Sizing DDP's noise for the cohort"). Here
each client's Skellam noise of variance V / n_min (V: the target central variance, in the ring's
integer units) is split into

    base  ~ Skellam of variance V / K                       K = n_min + L = n - c (most honest survivors)
    layer j ~ Skellam of variance V (1/k - 1/(k+1)),  k = n_min + j,  j = 0 .. L-1

which add up to V / n_min exactly (Skellam is infinitely divisible: independent Skellams sum to a
Skellam).

The discrete Gaussian is not: a sum of discrete Gaussians of unequal widths is not one, and the accounting
of arXiv 2102.06387 covers sums of equal-width ones. So with it each client's noise at the floor is G
independent units N_Z(0, V / (n_min G)) (`DistributedDPConfig.dg_units`), and a survivor count k keeps
units(k) = ceil(n_min G / k) of them: layer j (k = n_min + j) holds the units(k) - units(k + 1) units that
count k + 1 no longer needs, the base the units(K) that every count keeps. Every release is then a sum
of u units(u) equal-width units, at least V and less than (1 + u / (n_min G)) V; the ledger charges the
floor's n_min G units, and planning refuses a plan where a larger count's curve (more noise, a larger
tau) would exceed that charge (`distributed._checked`). Layer j is drawn from a key derived from the client's layer secret s_j
(`secagg.noise_layers`, a hash chain, Shamir-shared with the unmasking shares). Once the signed
survivor set U is fixed, u_eff = |U| - c, and every survivor's layers 0 .. u_eff - n_min - 1 are
regenerated from the revealed s_j and subtracted, leaving each survivor V / u_eff: the u_eff honest
survivors' noise sums to V for ANY survivor count from the floor up, including when a survivor
drops during the removal itself (its s_j is rebuilt from shares). Colluders' noise is never counted.

The accounting is unchanged (the mechanism's variance is V, as before); what changes is that V is
also what a released sum carries, not V x u_eff / n_min. Each release's planned and realised noise
is recorded in the ledger (`NoiseRecord`) and `python -m dp.recompute` recomputes the realised one.

Protocols: SecAgg and SecAgg+ share the layer secrets with the unmasking shares (threshold t);
LightSecAgg inside the sealed coded pieces (threshold T + 1); the plain protocol is refused.
Limits, stated: the discrete Gaussian is exact to whole units, not exactly V (above). Cost: every client
draws L + 1 noise vectors instead of one, and the server regenerates (index + 1) layers per
survivor (`benchmarks/xnoise_cost.py` measures both).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from dp.samplers import CryptoRandom, discrete_gaussian, skellam
from secagg.noise_layers import LayerSecrets, LayerSpec, layer_key, layer_keys


def discrete_gaussian_units(sigma: float, units: int, dim: int, rng: CryptoRandom) -> np.ndarray:
    """The sum of `units` independent N_Z(0, sigma^2) vectors (int64), each drawn in turn from `rng`."""
    out = np.zeros(dim, dtype=np.int64)
    for _ in range(units):
        out += discrete_gaussian(sigma, dim, rng)
    return out


@dataclass(frozen=True)
class LayeredNoise:
    """The split of one client's noise into a base and removable layers, for one plan."""

    spec: LayerSpec
    target_variance: float
    """V: the noise the honest survivors' sum must carry (integer units)."""
    units: int = 0
    """Discrete Gaussian: G equal-width units per client at the floor (0: Skellam, split exactly)."""

    def __post_init__(self) -> None:
        if not self.target_variance > 0 or not math.isfinite(self.target_variance):
            raise ValueError("target variance must be positive and finite")
        if isinstance(self.units, bool) or not isinstance(self.units, int) or self.units < 0:
            raise ValueError(f"units must be a non-negative int, got {self.units!r}")

    @property
    def unit_variance(self) -> float:
        """One discrete Gaussian unit's variance, V / (n_min G)."""
        return self.target_variance / (self.spec.floor * self.units)

    def unit_count(self, k: int) -> int:
        """Units each of k honest survivors keeps: ceil(n_min G / k) (G at the floor)."""
        return -(-self.spec.floor * self.units // k)

    @property
    def most_survivors(self) -> int:
        """K = n_min + L: the honest survivor count at which every layer is removed."""
        return self.spec.floor + self.spec.count

    @property
    def base_variance(self) -> float:
        if self.units:
            return self.unit_count(self.most_survivors) * self.unit_variance
        return self.target_variance / self.most_survivors

    def layer_units(self, j: int) -> int:
        """Discrete Gaussian: the units of layer j, those count floor + j + 1 no longer keeps."""
        k = self.spec.floor + j
        return self.unit_count(k) - self.unit_count(k + 1)

    def layer_variance(self, j: int) -> float:
        if self.units:
            return self.layer_units(j) * self.unit_variance
        k = self.spec.floor + j
        return self.target_variance * (1.0 / k - 1.0 / (k + 1))

    def client_variance(self) -> float:
        """What each client adds: V / n_min (base plus every layer)."""
        return self.base_variance + sum(self.layer_variance(j) for j in range(self.spec.count))

    def remaining_variance(self, index: int) -> float:
        """What one survivor's noise keeps once layers 0..index are removed: V / (n_min + index + 1)
        (discrete Gaussian: its units(n_min + index + 1) units)."""
        if self.units:
            return self.unit_count(self.spec.floor + index + 1) * self.unit_variance
        return self.target_variance / (self.spec.floor + index + 1)

    # ---- sampling -----------------------------------------------------------------------
    def client_noise(self, secrets: LayerSecrets, *, client: int, dim: int, rng: CryptoRandom,
                     prefixes: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        """Base (from `rng`, never revealed) plus every layer (each from its own key). `prefixes(j, P_j)`
        receives each prefix sum P_j = layers 0..j as it is formed (the client's own excess cache)."""
        if secrets.spec != self.spec:
            raise ValueError("layer secrets of another spec")
        layers = np.zeros(dim, dtype=np.int64)
        for j, s in enumerate(secrets.secrets):
            layers += self.layer(layer_key(s, client=client, index=j), j, dim)
            if prefixes is not None:
                prefixes(j, layers)
        if self.units:
            return layers + discrete_gaussian_units(math.sqrt(self.unit_variance),
                                                    self.unit_count(self.most_survivors), dim, rng)
        return layers + skellam(self.base_variance / 2.0, dim, rng)

    def layer(self, key: bytes, j: int, dim: int) -> np.ndarray:
        if self.units:
            return discrete_gaussian_units(math.sqrt(self.unit_variance), self.layer_units(j), dim, CryptoRandom(key))
        return skellam(self.layer_variance(j) / 2.0, dim, CryptoRandom(key))

    def removed(self, revealed: Mapping[int, int], index: int, *, dim: int) -> np.ndarray:
        """Sum over the contributors of their layers 0..index (int64), from the revealed s_index."""
        out = np.zeros(dim, dtype=np.int64)
        if index < 0:
            return out
        for client, secret in sorted(revealed.items()):
            for j, key in enumerate(layer_keys(secret, index, client=client)):
                out += self.layer(key, j, dim)
        return out

    def record(self, *, survivors: int, index: int) -> "NoiseRecord":
        honest = survivors - self.spec.colluders
        kept = self.remaining_variance(index)
        return NoiseRecord(target_variance=self.target_variance, floor=self.spec.floor, layers=self.spec.count,
                           colluders=self.spec.colluders, survivors=survivors, layer_index=index,
                           planned_variance=honest * self.client_variance(), realised_variance=honest * kept,
                           units=self.units)


@dataclass(frozen=True)
class NoiseRecord:
    """One release's noise, as the ledger keeps it (variances in the ring's integer units, honest
    survivors only): planned = what they added, realised = what the released sum carries."""

    target_variance: float
    floor: int
    layers: int
    colluders: int
    survivors: int
    layer_index: int
    planned_variance: float
    realised_variance: float
    units: int = 0
    """Discrete Gaussian units per client at the floor (0: Skellam, split exactly)."""
    round_id: int | None = None
    summary_key: str = ""

    def to_dict(self) -> dict:
        return asdict(self)
