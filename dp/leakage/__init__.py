"""Measured leakage, from the server's actual view (research/dp_leakage.md Sec. 4 and 5.2).

Record what the server received (`Transcript`), then run the cheap default attacks on it:
token-set recovery from embedding updates, the cross-round intersection attribution, the
recoverability of individual vectors from released sums, and the LOSS membership-inference
attack on the final model; collect the numbers in a `LeakageReport` next to the ledger's epsilon.
`measure_leakage` (``dp.leakage.pipeline``) runs all of them on one run's transcript.

Those default token numbers are an oracle (detector chosen with the truth, top-k told the true k).
The attacks an adversary can actually run: `calibrate_token_attack` (``dp.leakage.calibration``),
a token attack calibrated on shadow views it simulated, and `differencing_attack`
(``dp.leakage.differencing``), which estimates each client's contribution from the released cohort
sums; `measure_leakage(shadow=...)` reports both beside the oracle. ``dp.leakage.stats``: advantage
over chance and confidence intervals over seeds.
"""
from dp.leakage.calibration import RowStats, TokenAttack, calibrate_token_attack, row_stats
from dp.leakage.differencing import (ContributionEstimator, DifferencingScores, differencing_attack,
                                     estimate_contributions, fit_contributions, random_cohorts,
                                     simulate_differencing_shadow)
from dp.leakage.intersection import Attribution, AttributionScores, attribute_tokens, score_attribution
from dp.leakage.membership import (MembershipScores, calibrated_loss_attack, loss_threshold_attack,
                                   per_example_losses, score_attack, zlib_ratio_scores)
from dp.leakage.pipeline import (ATTACKS, SHADOW_KINDS, json_epsilon, ledger_epsilons, measure_leakage,
                                 oracle_summary, realistic_token_leakage, recoverable_updates, token_advantage,
                                 token_leakage)
from dp.leakage.recoverability import (Recoverability, ReconstructionScores, exposure_curve, membership_matrix,
                                       reconstruct, reconstruction_cosine, recoverable_clients,
                                       recoverable_from_transcript)
from dp.leakage.report import LeakageReport
from dp.leakage.stats import advantage_over_chance, mean_ci
from dp.leakage.token_recovery import (TokenScores, chance_f1, gaussian_sum, mean_scores, recover_from_transcript,
                                       recover_tokens, row_norms, score_tokens)
from dp.leakage.transcript import AggregateRecord, ReleasedRecord, Transcript, TranscriptFull

__all__ = [
    "Transcript", "TranscriptFull", "AggregateRecord", "ReleasedRecord",
    "TokenScores", "recover_tokens", "score_tokens", "chance_f1", "mean_scores", "row_norms",
    "recover_from_transcript", "gaussian_sum",
    "Attribution", "AttributionScores", "attribute_tokens", "score_attribution",
    "MembershipScores", "loss_threshold_attack", "calibrated_loss_attack", "score_attack", "zlib_ratio_scores", "per_example_losses",
    "Recoverability", "ReconstructionScores", "recoverable_clients", "exposure_curve", "membership_matrix",
    "reconstruct", "reconstruction_cosine", "recoverable_from_transcript",
    "LeakageReport",
    "ATTACKS", "measure_leakage", "token_leakage", "token_advantage", "recoverable_updates", "ledger_epsilons",
    "json_epsilon", "SHADOW_KINDS", "realistic_token_leakage", "oracle_summary",
    "RowStats", "row_stats", "TokenAttack", "calibrate_token_attack",
    "ContributionEstimator", "DifferencingScores", "fit_contributions", "estimate_contributions", "random_cohorts",
    "simulate_differencing_shadow", "differencing_attack",
    "advantage_over_chance", "mean_ci",
]
