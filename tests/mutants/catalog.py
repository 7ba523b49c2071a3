"""The mutants: one broken privacy guarantee each, applied in memory, with the tests that must kill it.

Every patch replaces a module attribute through the patcher (so a test's `monkeypatch` undoes it) and
keeps everything else of the library as it is. Patches that must tell two calls of one function apart
(the noise draw of a release from the public projection drawn by the same sampler) look at the
caller's code name, which is the narrowest point the library offers.
"""
from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from tests.mutants import Patcher, mutant

PRIVACY = "tests/secagg/test_protocol_privacy.py"
GUARD = "tests/secagg/test_disclosure_guard.py"
NOISE = "tests/dp/test_noise_power.py"


def _called_from(name: str, depth: int = 2) -> bool:
    """Whether the function `depth` frames up (the caller of the patched function) is named `name`."""
    return sys._getframe(depth).f_code.co_name == name


# ---- secure aggregation ------------------------------------------------------------------------

@mutant("secagg_no_pairwise_masks", quick=True,
        breaks="SecAgg(+): y_u = x_u + PRG(b_u) + sum_v sign(u,v) PRG(s_uv) loses its pairwise terms "
               "(client and server skip them), so y_u - PRG(b_u) = x_u",
        tests=(f"{PRIVACY}::test_a_coalition_below_the_threshold_cannot_recover_an_honest_secagg_input",))
def _secagg_no_pairwise_masks(mp: Patcher) -> None:
    from secagg import crypto
    from secagg.protocols import secagg as sa

    pairwise: set[bytes] = set()
    prefix = crypto.context("pairwise-mask")
    agree = crypto.agree

    def recording_agree(own: Any, peer_public: bytes, info: bytes) -> bytes:
        key = agree(own, peer_public, info)
        if info.startswith(prefix):
            pairwise.add(key)
        return key

    mp.setattr(crypto, "agree", recording_agree)
    _skip_masks(mp, sa, pairwise)


@mutant("secagg_no_self_mask",
        breaks="SecAgg(+): the self-mask PRG(b_u) is skipped (client and server), so a client the server "
               "took for dropped is unmasked by its rebuilt masking key when its upload arrives late",
        tests=(f"{PRIVACY}::test_a_delayed_secagg_client_is_not_unmasked_by_its_rebuilt_masking_key",
               "tests/secagg/test_secagg_protocol.py::test_masked_upload_structure_self_masks_hide_the_total"))
def _secagg_no_self_mask(mp: Patcher) -> None:
    from secagg.protocols import secagg as sa

    self_masks: set[bytes] = set()
    self_mask_key = sa._self_mask_key

    def recording_key(round_id: int, client: int, seed: int) -> bytes:
        key = self_mask_key(round_id, client, seed)
        self_masks.add(key)
        return key

    mp.setattr(sa, "_self_mask_key", recording_key)
    _skip_masks(mp, sa, self_masks)


def _skip_masks(mp: Patcher, sa: Any, skipped: set[bytes]) -> None:
    """SecAgg(+) applies masks through `apply_masks_` (a whole vector, the server's unmasking) and
    `MaskStream` (a chunked upload): both leave out the keys in `skipped`, on client and server alike."""
    apply_masks_, mask_stream = sa.apply_masks_, sa.MaskStream

    def kept(masks: Any) -> list:
        return [(key, sign) for key, sign in masks if key not in skipped]

    mp.setattr(sa, "apply_masks_", lambda target, masks, ring, **kw: apply_masks_(target, kept(masks), ring, **kw))
    mp.setattr(sa, "MaskStream", lambda masks, ring: mask_stream(kept(masks), ring))


@mutant("prg_segments_share_a_nonce",
        breaks="the mask keystream restarts every segment (every segment under GCM nonce 0), so a mask repeats "
               "every 4 MiB and one masked upload hands the server x[i] - x[i + SEGMENT]",
        tests=("tests/secagg/test_prg.py::test_the_segments_of_a_mask_are_not_repeats",
               "tests/secagg/test_prg.py::test_2_32_mask_is_aes_256_gcm_of_zeros_one_nonce_per_segment"))
def _prg_segments_share_a_nonce(mp: Patcher) -> None:
    from secagg import prg

    seek = prg._Keystream._seek

    def first_segment_only(stream: Any, position: int) -> None:
        seek(stream, position % (4 * prg.SEGMENT))
        stream._position = position

    mp.setattr(prg._Keystream, "_seek", first_segment_only)


@mutant("secagg_chunks_unmasked",
        breaks="SecAgg(+) with chunked uploads: each chunk goes out as the input's values, unmasked "
               "(the server reads x_u chunk by chunk)",
        tests=("tests/secagg/test_chunks.py::test_chunks_arrive_in_any_order_and_each_is_masked_with_its_window_of_the_keystream",))
def _secagg_chunks_unmasked(mp: Patcher) -> None:
    from secagg.protocols import secagg as sa

    def unmasked(client: Any, plan: Any, x: np.ndarray, masks: Any, indices: Any):
        for index in indices:
            start, end = plan.bounds(index)
            yield client._reply("masked_chunk", index=index, vector=np.array(x[start:end], dtype=np.uint32))

    mp.setattr(sa, "_masked_chunks", unmasked)


@mutant("lightsecagg_zero_mask",
        breaks="LightSecAgg: y_j = x_j + z_j with z_j = 0 (the one-time pad is gone: uploads are the inputs)",
        tests=(f"{PRIVACY}::test_a_coalition_of_t_clients_cannot_recover_an_honest_lightsecagg_input",))
def _lightsecagg_zero_mask(mp: Patcher) -> None:
    from secagg.protocols import lightsecagg as lsa

    mp.setattr(lsa, "random_vector", lambda ring, length: np.zeros(length, dtype=np.uint32))


@mutant("lightsecagg_zero_random_pieces",
        breaks="LightSecAgg: the code's T random pieces are zero, so any U - T coded pieces (T colluders' own, "
               "T >= U - T at the default T = N/2, U = 0.8N) determine a client's mask: T-privacy is gone",
        tests=(f"{PRIVACY}::test_a_coalition_of_t_clients_cannot_recover_an_honest_lightsecagg_input",))
def _lightsecagg_zero_random_pieces(mp: Patcher) -> None:
    from secagg import lcc
    from secagg.protocols import lightsecagg as lsa

    class ZeroNoise(lcc.KeyedNoise):
        def columns(self, c0: int, c1: int) -> np.ndarray:
            return np.zeros((self.shape[0], c1 - c0), dtype=np.uint32)

    mp.setattr(lsa, "KeyedNoise", ZeroNoise)


@mutant("lightsecagg_piece_in_clear",
        breaks="LightSecAgg: coded mask pieces [~z_i]_j reach the relaying server unsealed, so it holds N-1 >= U "
               "pieces of every mask and decodes each z_i",
        tests=(f"{PRIVACY}::test_a_coalition_of_t_clients_cannot_recover_an_honest_lightsecagg_input",))
def _lightsecagg_piece_in_clear(mp: Patcher) -> None:
    from secagg import crypto
    from secagg.protocols import lightsecagg as lsa

    def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
        return bytes(crypto.NONCE_BYTES) + plaintext + bytes(crypto.TAG_BYTES)  # same size, no secrecy

    def open_sealed(key: bytes, blob: bytes, aad: bytes) -> bytes:
        if len(blob) < crypto.NONCE_BYTES + crypto.TAG_BYTES:
            raise crypto.DecryptionError("sealed message too short")
        return blob[crypto.NONCE_BYTES:len(blob) - crypto.TAG_BYTES]

    mp.setattr(lsa, "seal", seal)
    mp.setattr(lsa, "open_sealed", open_sealed)


@mutant("client_accepts_low_threshold",
        breaks="SecAgg client policy: a threshold t <= (neighbours + 1) / 2 is accepted, so a server lying about "
               "who dropped can collect both b_u and s_sk_u",
        tests=("tests/secagg/test_secagg_protocol.py::test_client_refuses_unsafe_threshold_from_a_misconfigured_server",))
def _client_accepts_low_threshold(mp: Patcher) -> None:
    import dataclasses

    from secagg.protocols.secagg import SecAggPlusClient

    init = SecAggPlusClient.__init__

    def lax_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.policy = dataclasses.replace(self.policy, min_threshold_fraction=0.0)

    mp.setattr(SecAggPlusClient, "__init__", lax_init)


@mutant("client_skips_signature_check",
        breaks="Enrolled clients accept relayed round keys (and signed statements) without checking the peer's "
               "Ed25519 signature against the roster: a substituted key goes unnoticed",
        tests=("tests/secagg/test_identity.py::test_a_server_substituting_a_peers_round_key_is_caught_by_the_client",))
def _client_skips_signature_check(mp: Patcher) -> None:
    from secagg.identity import Roster
    from secagg.protocols.base import ClientProtocol

    verify = Roster.verify

    def verify_unless_client(self: Any, client_id: int, signature: bytes, message: bytes) -> bool:
        frame = sys._getframe(1)
        for _ in range(4):  # the client's method, or a helper / generator expression it called
            if frame is None:
                break
            if isinstance(frame.f_locals.get("self"), ClientProtocol):
                return True
            frame = frame.f_back
        return verify(self, client_id, signature, message)

    mp.setattr(Roster, "verify", verify_unless_client)


@mutant("prg_not_secret",
        breaks="CryptoRandom() (rounding and DP noise randomness) is keyed by a fixed key instead of os.urandom: "
               "every fresh stream is the same, so anyone can predict (and subtract) it",
        tests=("tests/dp/test_samplers.py::test_default_streams_are_fresh_and_fixed_keys_reproduce",
               "tests/secagg/test_encoding.py::test_rounding_randomness_is_fresh_per_encode"))
def _prg_not_secret(mp: Patcher) -> None:
    from secagg.prg import CryptoRandom

    init = CryptoRandom.__init__

    def fixed_init(self: Any, key: bytes | None = None) -> None:
        init(self, bytes(32) if key is None else key)

    mp.setattr(CryptoRandom, "__init__", fixed_init)


@mutant("encoder_clip_skipped", quick=True,
        breaks="Fixed-point encoding: x is not clipped to [-clip, clip] before scaling, so one client's value is "
               "unbounded (sensitivity and the no-wrap bound are lost)",
        tests=("tests/secagg/test_encoding.py::test_clipping_is_counted_and_applied",))
def _encoder_clip_skipped(mp: Patcher) -> None:
    from secagg import encoding

    class NoClipNumpy:
        """numpy, except that `clip` copies its input unclipped."""

        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

        @staticmethod
        def clip(a: np.ndarray, lo: Any, hi: Any, out: np.ndarray | None = None) -> np.ndarray:
            if out is None:
                return np.array(a, dtype=np.float64)
            out[...] = a
            return out

    mp.setattr(encoding, "np", NoClipNumpy())


# ---- differential privacy --------------------------------------------------------------------------

@mutant("ddp_no_noise",
        breaks="Distributed DP: each client's Skellam / discrete Gaussian noise is 0, so the sum has no noise",
        tests=("tests/dp/test_distributed.py::test_summed_noise_has_the_calibrated_variance_and_decodes",
               f"{NOISE}::test_distributed_survivor_sum_carries_the_central_noise"))
def _ddp_no_noise(mp: Patcher) -> None:
    from dp.distributed import DistributedDPEncoder

    mp.setattr(DistributedDPEncoder, "_noise",
               lambda self, rng: np.zeros(self.plan.padded_dim, dtype=np.int64))


@mutant("ddp_half_noise",
        breaks="Distributed DP: each client's local noise has half the calibrated variance (s sigma_l)^2",
        tests=("tests/dp/test_distributed.py::test_summed_noise_has_the_calibrated_variance_and_decodes",
               f"{NOISE}::test_distributed_survivor_sum_carries_the_central_noise"))
def _ddp_half_noise(mp: Patcher) -> None:
    from dp import distributed

    skellam, discrete_gaussian = distributed.skellam, distributed.discrete_gaussian
    mp.setattr(distributed, "skellam", lambda lam, size, rng: skellam(lam / 2.0, size, rng))
    mp.setattr(distributed, "discrete_gaussian",
               lambda sigma, size, rng: discrete_gaussian(sigma / math.sqrt(2.0), size, rng))


@mutant("ddp_survivor_floor_ignored",
        breaks="Distributed DP: a sum of fewer than n_min clients (less noise than calibrated) is opened: the "
               "protocol floor is 2 and decoding no longer refuses it",
        tests=("tests/dp/test_distributed.py::test_dropout_margin_calibrates_to_survivors_and_refuses_fewer",
               "tests/dp/test_distributed.py::test_the_protocol_floor_is_the_calibrated_survivor_count"))
def _ddp_survivor_floor_ignored(mp: Patcher) -> None:
    from dp.distributed import DistributedDPConfig, DistributedDPEncoder, TooManyClientsError

    def only_the_ceiling(self: Any, n_clients: int) -> None:
        if n_clients > self.plan.config.expected_clients:
            raise TooManyClientsError(f"{n_clients} contributors > expected_clients")

    mp.setattr(DistributedDPConfig, "protocol_floor", lambda self: 2)
    mp.setattr(DistributedDPEncoder, "check_survivors", only_the_ceiling)


XNOISE = "tests/dp/test_xnoise.py"


@mutant("xnoise_base_too_small",
        breaks="Exact DDP (XNoise): each client's secret base noise has half its variance V / K, so once the "
               "excess layers are removed the survivors' noise is below the accounted target",
        tests=(f"{XNOISE}::test_the_released_noise_is_the_target_at_every_dropout_rate",))
def _xnoise_base_too_small(mp: Patcher) -> None:
    from dp.xnoise import LayeredNoise

    mp.setattr(LayeredNoise, "base_variance", property(lambda self: self.target_variance / self.most_survivors / 2))


@mutant("xnoise_layers_left_in",
        breaks="Exact DDP (XNoise): the server subtracts nothing, so the excess noise stays in (floor-sized "
               "noise under an exact-noise ledger record)",
        tests=(f"{XNOISE}::test_the_released_noise_is_the_target_at_every_dropout_rate",
               f"{XNOISE}::test_survivors_that_drop_during_the_removal_are_removed_from_their_shares"))
def _xnoise_layers_left_in(mp: Patcher) -> None:
    # Both ways layers leave a sum: the survivors' own excess, and those rebuilt from revealed secrets.
    # (Until 2026-11-29 this patched only the rebuilt ones, which survivors' own excess had made rare:
    # the mutant survived.)
    from dp.distributed import DistributedDPEncoder

    mp.setattr(DistributedDPEncoder, "remove_layers",
               lambda self, ring_sum, *, spec, index, revealed, excess=None: ring_sum.copy())


@mutant("xnoise_reveals_one_layer_more",
        breaks="Exact DDP (XNoise): clients (and the server) reveal and remove one layer more than the honest "
               "survivors warrant, leaving less noise than the accounted target",
        tests=(f"{XNOISE}::test_the_released_noise_is_the_target_at_every_dropout_rate",
               f"{XNOISE}::test_honest_survivors_keep_exactly_the_target_for_every_count"))
def _xnoise_reveals_one_layer_more(mp: Patcher) -> None:
    from secagg.noise_layers import LayerSpec

    honest = LayerSpec.reveal_index
    mp.setattr(LayerSpec, "reveal_index", lambda self, survivors: min(honest(self, survivors) + 1, self.count - 1))


@mutant("xnoise_dg_units_rounded_down",
        breaks="Exact DDP with the discrete Gaussian: each survivor keeps floor(n_min G / u) equal-width units "
               "instead of the ceiling, so a release carries less than the accounted target",
        tests=(f"{XNOISE}::test_exact_discrete_gaussian_noise_is_the_target_to_a_unit_at_every_dropout_rate",
               f"{XNOISE}::test_discrete_gaussian_units_leave_at_least_the_target_and_within_one_unit_per_survivor"))
def _xnoise_dg_units_rounded_down(mp: Patcher) -> None:
    from dp.xnoise import LayeredNoise

    mp.setattr(LayeredNoise, "unit_count", lambda self, k: self.spec.floor * self.units // k)


@mutant("central_dp_half_noise",
        breaks="Central DP: the trusted server adds N(0, z^2 C^2 / 2) instead of N(0, z^2 C^2)",
        tests=("tests/dp/test_central.py::test_release_is_labelled_non_private_against_the_server",
               f"{NOISE}::test_central_noise_has_variance_z_c_squared"))
def _central_dp_half_noise(mp: Patcher) -> None:
    from dp import central

    gaussian = central.gaussian
    mp.setattr(central, "gaussian", lambda sigma, size, rng: gaussian(sigma / math.sqrt(2.0), size, rng))


@mutant("sketch_no_noise",
        breaks="DP sketch: s + N(0, sigma^2 I_k) is released as s (the public projection is still drawn)",
        tests=(f"{NOISE}::test_sketch_noise_has_the_calibrated_variance",))
def _sketch_no_noise(mp: Patcher) -> None:
    from dp import sketches

    gaussian = sketches.gaussian

    def noiseless_release(sigma: float, size: int, rng: Any) -> np.ndarray:
        return np.zeros(size) if _called_from("release") else gaussian(sigma, size, rng)

    mp.setattr(sketches, "gaussian", noiseless_release)


@mutant("centroid_descriptor_no_noise",
        breaks="DP centroids: each Lloyd step releases [S, n] without its N(0, sigma^2) noise",
        tests=("tests/dp/test_centroids.py::test_noise_on_the_counts_has_the_calibrated_scale",
               f"{NOISE}::test_centroid_noise_has_the_calibrated_variance"))
def _centroid_descriptor_no_noise(mp: Patcher) -> None:
    from dp import centroids

    gaussian = centroids.gaussian

    def noiseless_release(sigma: float, size: int, rng: Any) -> np.ndarray:
        return np.zeros(size) if _called_from("release") else gaussian(sigma, size, rng)

    mp.setattr(centroids, "gaussian", noiseless_release)


@mutant("dpsgd_noise_ignored",
        breaks="DP-SGD: Opacus adds no N(0, z^2 C^2) to the summed clipped gradients, while the accountant "
               "still charges noise multiplier z",
        tests=(f"{NOISE}::test_dpsgd_step_noise_is_z_times_max_grad_norm",))
def _dpsgd_noise_ignored(mp: Patcher) -> None:
    import torch
    from opacus.optimizers import optimizer

    mp.setattr(optimizer, "_generate_noise",
               lambda std, reference, *args, **kwargs: torch.zeros_like(reference))


@mutant("ledger_off_by_one",
        breaks="Ledger composition: a mechanism used k times is composed k - 1 times (one round is free)",
        tests=("tests/dp/test_ledger.py::test_heterogeneous_gaussians_and_pld_option_match_dp_accounting",))
def _ledger_off_by_one(mp: Patcher) -> None:
    from dp import ledger

    compose = ledger.compose_epsilon

    def one_fewer(parts: Any, **kwargs: Any) -> float:
        return compose([(m, c - 1) for m, c in parts], **kwargs)

    mp.setattr(ledger, "compose_epsilon", one_fewer)


@mutant("admission_trusts_claim",
        breaks="Admission: the server charges a client's release by the noise scale (sigma, sensitivity, multiplier) "
               "the client claims instead of recomputing it from the declared mechanism and public metadata",
        tests=("tests/dp/test_admission.py::test_a_forged_mechanism_is_refused_and_nothing_is_charged",))
def _admission_trusts_claim(mp: Patcher) -> None:
    import copy
    import dataclasses

    from dp import admission

    admit = admission.admit
    noise_scale = ("sigma", "sensitivity", "noise_multiplier")

    class Trusting:
        """The declared spec; its `verify` runs every check, but against a plan that takes the record's
        own noise scale for the one recomputed from the public metadata."""

        def __init__(self, spec: Any) -> None:
            self.spec = spec

        def __getattr__(self, name: str) -> Any:
            return getattr(self.spec, name)

        def verify(self, record: Any) -> Any:
            claimed = {k: v for k, v in record.mechanism.items() if k in noise_scale and isinstance(v, float)}
            plan = self.spec.plan

            def believing_plan(**kwargs: Any) -> Any:
                ours = plan(**kwargs)
                return dataclasses.replace(ours, **{k: v for k, v in claimed.items()
                                                    if k in {f.name for f in dataclasses.fields(ours)}})

            clone = copy.copy(self.spec)
            clone.plan = believing_plan
            return type(self.spec).verify(clone, record)

    def trusting_admit(records: Any, *, specs: Any, **kwargs: Any) -> Any:
        return admit(records, specs={k: Trusting(v) for k, v in specs.items()}, **kwargs)

    mp.setattr(admission, "admit", trusting_admit)


# ---- disclosure guard ------------------------------------------------------------------------------

@mutant("guard_disabled",
        breaks="Disclosure guard: every noise-free sum is authorised (no minimum cohort, no leverage check)",
        tests=(f"{GUARD}::test_two_sums_attack_is_refused_naming_the_victim",))
def _guard_disabled(mp: Patcher) -> None:
    from secagg.disclosure_guard import Decision, DisclosureGuard

    def allow(self: Any, summary_key: str, members: Any, *, noise: Any, record: bool) -> Decision:
        ids = tuple(sorted({int(m) for m in members}))
        return Decision(summary_key, ids, noise is not None, 0, 0.0)

    mp.setattr(DisclosureGuard, "_decide", allow)
    mp.setattr(DisclosureGuard, "authorize_count", lambda self, *args, **kwargs: None)


@mutant("guard_min_cohort_ignored",
        breaks="Disclosure guard: the minimum-cohort rule is 1, so a noise-free sum of one or two clients passes",
        tests=(f"{GUARD}::test_min_cohort_rule", f"{GUARD}::test_anonymous_groups_follow_the_size_rule_and_leave_no_history"))
def _guard_min_cohort_ignored(mp: Patcher) -> None:
    import dataclasses

    from secagg.disclosure_guard import DisclosureGuard

    init = DisclosureGuard.__init__

    def lax_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.config = dataclasses.replace(self.config, min_cohort=1)

    mp.setattr(DisclosureGuard, "__init__", lax_init)


@mutant("guard_forget_readmits", quick=True,
        breaks="Disclosure guard: after forget(key), the key is a fresh history, so S(A) then S(A + {i}) under "
               "it exposes x_i (the two-sums attack)",
        tests=(f"{GUARD}::test_forget_drops_a_key_and_state_can_be_limited_to_keys",))
def _guard_forget_readmits(mp: Patcher) -> None:
    from secagg.disclosure_guard import DisclosureGuard

    def forget_everything(self: Any, summary_keys: Any) -> None:
        for key in summary_keys:
            self._keys.pop(key, None)

    mp.setattr(DisclosureGuard, "forget", forget_everything)


@mutant("guard_accepts_uncharged_noise",
        breaks="Disclosure guard: a release claiming DP noise is allowed without the contributors' ledger charges",
        tests=(f"{GUARD}::test_dp_noised_releases_are_recorded_and_allowed_when_charged",))
def _guard_accepts_uncharged_noise(mp: Patcher) -> None:
    from secagg.disclosure_guard import DisclosureGuard

    mp.setattr(DisclosureGuard, "_check_noise", lambda self, summary_key, ids, noise: None)


# ---- engine ------------------------------------------------------------------------------------------

@mutant("peer_channel_no_round_aad", quick=True,
        breaks="Peer channel: the round is not in the AES-GCM associated data, so a relayed ciphertext replayed "
               "into another round opens",
        tests=("tests/fl_algorithms/engine/test_peer_channel.py::test_misattributed_or_moved_relays_fail",))
def _peer_channel_no_round_aad(mp: Patcher) -> None:
    from fl_algorithms.engine.peer_channel import PeerChannel
    from secagg import crypto

    def aad_without_round(self: Any, *, sender: int, receiver: int, round: int) -> bytes:
        return crypto.context("peer-message", self.purpose, self.run, sender, receiver)

    mp.setattr(PeerChannel, "_aad", aad_without_round)


# ---- colluding insiders (the accusation rule, survivor floors, consistency, cross-checks) ----------

COLLUDERS = "tests/secagg/test_colluders.py"


@mutant("accusation_blames_one_end",
        breaks="accusations drop one end only (the old greedy cover, the accused on a tie): two colluders "
               "accusing one victim drop it alone, so colluders cost more honest seats than their own",
        tests=("tests/secagg/test_secagg_protocol.py::test_accusations_never_cost_more_honest_seats_than_colluding_ones",
               "tests/secagg/test_secagg_protocol.py::test_a_share_that_fails_authentication_drops_both_ends_not_the_round"))
def _accusation_blames_one_end(mp: Patcher) -> None:
    from secagg.protocols import base

    def one_end(accused_by):
        edges = {(a, u) for a, us in accused_by.items() for u in us if a != u}
        out: dict[int, str] = {}
        while edges:
            degree: dict[int, list[int]] = {}
            for a, u in edges:
                degree.setdefault(a, [0, 0])[0] += 1
                degree.setdefault(u, [0, 0])[0] += 1
                degree[u][1] += 1
            c = min(degree, key=lambda k: (-degree[k][0], -degree[k][1], k))
            out[c] = "disputed"
            edges = {(a, u) for a, u in edges if c not in (a, u)}
        return out, ()

    mp.setattr(base, "accusation_matching", one_end)


@mutant("survivor_floor_ignores_colluders",
        breaks="a round opens with g survivors whatever c is (floors.survivors = g, partners = t - 1): the server "
               "and c colluders subtract their inputs from a sum with fewer than g honest clients",
        tests=(f"{COLLUDERS}::test_the_server_withholding_a_victims_partners_cannot_open_its_input",
               f"{COLLUDERS}::test_lightsecagg_needs_g_plus_c_survivors_on_both_sides"))
def _survivor_floor_ignores_colluders(mp: Patcher) -> None:
    from secagg.protocols import consistency

    mp.setattr(consistency.Floors, "survivors", property(lambda self: self.min_group))
    mp.setattr(consistency.Floors, "partners", property(lambda self: 1))


@mutant("ring_isolation_unchecked", quick=True,
        breaks="SecAgg+: the server opens a survivor set from which c colluders could cut a component of "
               "fewer than g honest clients out of the ring",
        tests=(f"{COLLUDERS}::test_smallest_isolable_group_is_exact_on_the_ring",))
def _ring_isolation_unchecked(mp: Patcher) -> None:
    from secagg import graph
    from secagg.protocols import secagg as sa

    mp.setattr(graph, "smallest_isolable_group", lambda **kw: None)
    mp.setattr(sa, "smallest_isolable_group", lambda **kw: None)


@mutant("consistency_check_skipped",
        breaks="clients reveal unmasking shares / recovery pieces without t (U) valid signatures over the "
               "survivor set they signed: a server can show different clients different survivor sets",
        tests=(f"{COLLUDERS}::test_a_server_showing_two_survivor_sets_gets_no_unmasking_material",))
def _consistency_check_skipped(mp: Patcher) -> None:
    from secagg.protocols import lightsecagg as lsa
    from secagg.protocols import secagg as sa

    for module in (sa, lsa):
        mp.setattr(module, "require_signatures", lambda *a, **kw: None)


@mutant("unmask_shares_unchecked",
        breaks="the server trusts the first t unmasking shares (and the first U recovery pieces): a wrong one "
               "corrupts the sum silently and its sender goes unnamed",
        tests=(f"{COLLUDERS}::test_a_wrong_unmasking_share_is_corrected_and_its_sender_named",
               f"{COLLUDERS}::test_a_wrong_lightsecagg_recovery_piece_is_located_and_left_out"))
def _unmask_shares_unchecked(mp: Patcher) -> None:
    from secagg import reed_solomon, shamir

    def first_t(xs, rows, *, k, prime, max_errors=None):
        xs = list(xs)[:k]
        return shamir.combine(xs, [list(r)[:k] for r in rows]), [frozenset() for _ in rows]

    mp.setattr(reed_solomon, "decode_many", first_t)
    mp.setattr(reed_solomon, "locate_vector_errors", lambda *a, **kw: frozenset())


@mutant("duplicate_keys_keep_first",
        breaks="a round key advertised by two clients keeps the first advertiser (a copier can then stand "
               "in for another client's keys) instead of dropping both",
        tests=("tests/secagg/test_secagg_protocol.py::test_duplicate_public_keys_drop_every_advertiser_and_the_round_goes_on",))
def _duplicate_keys_keep_first(mp: Patcher) -> None:
    from secagg.protocols.base import ServerProtocol

    mark_faulty = ServerProtocol.mark_faulty

    def keep_first(self, client: int, reason: str) -> None:
        if "all advertised" in reason and client == min(int(c) for c in reason.split("[")[1].split("]")[0].split(",")):
            return
        mark_faulty(self, client, reason)

    mp.setattr(ServerProtocol, "mark_faulty", keep_first)


@mutant("guard_accepts_negligible_noise",
        breaks="a 'noisy' release passes the disclosure guard whatever its noise, once charged: a differencing "
               "pair with noise multiplier 0.01 is accepted",
        tests=(f"{GUARD}::test_a_noisy_release_needs_noise_its_mechanism_calibrates_to_a_bounded_epsilon",))
def _guard_accepts_negligible_noise(mp: Patcher) -> None:
    from secagg.disclosure_guard import DisclosureGuard

    init = DisclosureGuard.__init__

    def no_epsilon_test(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("noise_epsilon", None)
        init(self, *args, **kwargs)

    mp.setattr(DisclosureGuard, "__init__", no_epsilon_test)


# ---- the papers' equations (tests/fl_algorithms/algorithms/test_paper_behaviour.py) ----------------

PAPERS = "tests/fl_algorithms/algorithms/test_paper_behaviour.py"


@mutant("fedmcp_eval_global_adapter",
        breaks="FedMCP Sec. IV-B: a client predicts with the global adapter alone under the full model's head "
               "g1, instead of h + 1/2 A_g(h) + 1/2 A_p(h) with g1",
        tests=(f"{PAPERS}::test_fedmcp_predicts_with_the_full_model_and_its_own_classifier_g1",))
def _fedmcp_eval_global_adapter(mp: Patcher) -> None:
    import dataclasses

    from fl_algorithms.algorithms.fedmcp import FULL_MODEL, GLOBAL
    from fl_algorithms.training.adapter_trainer import AdapterTrainer

    evaluate = AdapterTrainer.evaluate

    def global_adapter_only(self: Any, *, split: str = "test") -> dict[str, float]:
        spec = self.spec
        if dict(spec.predict_mixing) != dict(FULL_MODEL):
            return evaluate(self, split=split)
        self.spec = dataclasses.replace(spec, predict_mixing={GLOBAL: 1.0})
        try:
            return evaluate(self, split=split)
        finally:
            self.spec = spec

    mp.setattr(AdapterTrainer, "evaluate", global_adapter_only)


@mutant("atc_no_group_update",
        breaks="ATC Eq. 4: the CONTRAST rounds' group update sum_{i in C+_n} |D_i| / |D_C+_n| Delta w_i is "
               "dropped, so w_n^(t+1) = w_n^t",
        tests=(f"{PAPERS}::test_atc_contrast_rounds_apply_eq_4_the_size_weighted_mean_update_of_c_plus",))
def _atc_no_group_update(mp: Patcher) -> None:
    from fl_algorithms.algorithms.atc import ATC

    server_update = ATC.server_update

    def without_group_update(self: Any, *, state: dict[str, Any], view: Any) -> dict[str, Any]:
        new = server_update(self, state=state, view=view)
        if self.contrasting(view.round) and state["near"]:
            new = {**new, "updates": {}}
        return new

    mp.setattr(ATC, "server_update", without_group_update)


@mutant("fedseit_uniform_alpha",
        breaks="FedSeIT SIT: the top-K foreign tasks' initial alphas are 1/K instead of their normalised "
               "similarity scores",
        tests=(f"{PAPERS}::test_sit_alphas_are_the_normalised_scores_of_distinct_descriptors",
               f"{PAPERS}::test_sit_alphas_reach_the_foreign_adaptives_attention_in_the_clients_model"))
def _fedseit_uniform_alpha(mp: Patcher) -> None:
    from fl_algorithms.algorithms.fedseit import FederatedContinual

    select = FederatedContinual.select

    def uniform(self: Any, **kwargs: Any) -> list[list[float]]:
        chosen = select(self, **kwargs)
        return [[owner, task, 1.0 / len(chosen)] for owner, task, _ in chosen]

    mp.setattr(FederatedContinual, "select", uniform)


@mutant("adafedselectkd_trains_global_adapter",
        breaks="AdaFedSelectKD Sec. III-B: the global adapter A_g, a parameter container, is optimised with the "
               "client's task loss next to A_l, so the teacher drifts from the server's parameters",
        tests=(f"{PAPERS}::test_the_global_adapter_is_bit_identical_after_local_training_with_the_real_trainer",))
def _adafedselectkd_trains_global_adapter(mp: Patcher) -> None:
    from fl_algorithms.algorithms.adafedselectkd import GLOBAL, LOCAL
    from fl_algorithms.tasks import summarization
    from fl_algorithms.tasks.seq2seq import headline_loss
    from nlp_models.adapters import active, set_trainable_sets

    fit = summarization.SummaryTrainer.fit

    def train_both(self: Any, *, epochs: int, objective: Any, round: int | None = None) -> dict[str, float]:
        decoder = self.model.decoder
        set_trainable_sets(decoder, (GLOBAL, LOCAL))
        self._optimizer = None  # rebuilt over A_g and A_l

        def with_global_task_loss(model: Any, batch: Any) -> Any:
            with active(decoder, {GLOBAL: 1.0}):
                global_loss = headline_loss(model.model, batch)
            return objective(model, batch) + global_loss

        try:
            return fit(self, epochs=epochs, objective=with_global_task_loss, round=round)
        finally:
            set_trainable_sets(decoder, (LOCAL,))

    mp.setattr(summarization.SummaryTrainer, "fit", train_both)
