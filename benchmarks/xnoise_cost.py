"""What dropout-exact distributed DP (XNoise, `dp.xnoise`) costs a round, against SecAgg+ with floor-sized noise.

One round of N clients over d values under distributed DP (Skellam, or the discrete Gaussian with
`--mechanism discrete_gaussian`: G = 16 equal-width units a client; floor n_min = ceil(floor_fraction N)),
measured in parts, in one process:

* encode: one client's clip, rotation, rounding and noise (XNoise: a base and L = N - n_min layers);
  the mean of `--encode-samples` clients, then counted N times (simulation) or once (a deployment, whose
  clients encode in parallel);
* protocol: the SecAgg+ round over N pre-encoded vectors (XNoise adds L Shamir shares per neighbour and
  one revealed layer share per survivor), at each dropout rate (dropped before masking);
* excess (XNoise only): one survivor regenerating its own layers 0..index (index = u - n_min - 1),
  which it sends with its unmasking reply (4d more bytes up); counted like encode;
* removal (XNoise only): the server subtracting the survivors' summed excess (survivors that drop
  during the removal would be regenerated from their revealed secrets: none here);
* decode: the centred lift, inverse rotation and scaling.

    python -m benchmarks.xnoise_cost                      # N = 50, d = 1e6, dropout 0 and 0.2 (about 12 min on 2 cores)
    python -m benchmarks.xnoise_cost --quick              # N = 12, d = 1e4
    python -m benchmarks.xnoise_cost --noise              # the noise itself, 0-40% dropout, both protocols

prints one `xnoise ...` line per dropout rate with the seconds of each part and
`sim_ratio` / `deploy_ratio`: XNoise's round over the floor-sized round's, all measured in this run;
`deploy_ratio_noise_ahead` is the same when clients draw their noise (which does not depend on the
update) ahead of the round, e.g. while they train; `upload_ratio`: a survivor's bytes up.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time

import numpy as np


def _encode_seconds(encoder, *, dim: int, samples: int, layers) -> tuple[float, list]:
    """Mean seconds of one client's encoding, and the layer secrets each sample encoded with (their
    excess functions hold what encoding kept)."""
    rng = np.random.default_rng(0)
    times, kept = [], []
    for client in range(1, samples + 1):
        x = rng.normal(0, 0.01, dim)
        secrets = None
        if layers is not None:
            secrets = layers()
            secrets = dataclasses.replace(secrets, excess=encoder.excess_fn(secrets, client=client))
        t0 = time.perf_counter()
        encoder.encode(x, round_seed=1, noise_layers=secrets, client=client)
        times.append(time.perf_counter() - t0)
        kept.append(secrets)
    return float(np.mean(times)), kept


def measure(*, clients: int, dim: int, floor_fraction: float, dropouts: list[float], encode_samples: int,
            mechanism: str = "skellam") -> list[dict]:
    from dp.distributed import DistributedDPConfig, DistributedDPEncoder
    from secagg.noise_layers import LayerSecrets
    from secagg.protocols.secagg import SecAggPlusClient, SecAggPlusServer
    from secagg.simulate import run_round

    floor = max(2, math.ceil(floor_fraction * clients))
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=clients, min_clients=floor,
                                 bits=20, exact_noise=True, mechanism=mechanism)
    encoder = DistributedDPEncoder.from_config(config, dim=dim)
    spec = config.layer_spec()
    length = encoder.length
    floor_sized = DistributedDPEncoder.from_config(dataclasses.replace(config, exact_noise=False), dim=dim)
    enc_plain, _ = _encode_seconds(floor_sized, dim=dim, samples=encode_samples, layers=None)
    enc_exact, encoded = _encode_seconds(encoder, dim=dim, samples=encode_samples * len(dropouts),
                                         layers=lambda: LayerSecrets.fresh(spec))
    decode_t0 = time.perf_counter()
    encoder.decode(np.zeros(length, np.uint32), round_seed=1, n_clients=clients)
    decode = time.perf_counter() - decode_t0
    rng = np.random.default_rng(1)
    vectors = {c: rng.integers(0, 2**32, length, dtype=np.uint32) for c in range(1, clients + 1)}
    stand_in = rng.integers(0, 2**20, length, dtype=np.uint32)  # each survivor's excess, timed apart below
    secrets = {c: dataclasses.replace(LayerSecrets.fresh(spec), excess=lambda index: stand_in) for c in vectors}
    rows = []
    for row_index, dropout in enumerate(dropouts):
        dropped = set(range(1, round(dropout * clients) + 1))
        seconds, sent = {}, {}
        for exact in (False, True):
            server = SecAggPlusServer(round_id=1, clients=sorted(vectors), length=length, min_clients=floor,
                                      noise_layers=spec if exact else None)
            protos = {c: SecAggPlusClient(client_id=c, round_id=1, input_fn=lambda v=v: v,
                                          noise_layers=secrets[c] if exact else None) for c, v in vectors.items()}
            sent[exact] = {}
            t0 = time.perf_counter()
            result = run_round(server, protos, drop_at={"masked": dropped} if dropped else None, bytes_sent=sent[exact])
            seconds[exact] = time.perf_counter() - t0
        index = result.layer_index
        times = []
        for sample in encoded[row_index * encode_samples:(row_index + 1) * encode_samples]:
            t0 = time.perf_counter()
            sample.excess(index)  # what encoding kept (prefix sums), or its layers redrawn when too large to keep
            times.append(time.perf_counter() - t0)
        excess = float(np.mean(times))
        t0 = time.perf_counter()
        encoder.remove_layers(result.ring_sum, spec=spec, index=index, revealed=result.layer_secrets,
                              excess=result.layer_excess)
        removal = time.perf_counter() - t0
        survivors = len(result.contributors)
        sim_plain = clients * enc_plain + seconds[False] + decode
        sim_exact = clients * enc_exact + survivors * excess + seconds[True] + removal + decode
        dep_plain = enc_plain + seconds[False] + decode
        dep_exact = enc_exact + excess + seconds[True] + removal + decode
        up = {k: float(np.median(list(v.values()))) for k, v in sent.items()}
        rows.append({"mechanism": mechanism, "clients": clients, "dim": dim, "floor": floor, "layers": spec.count,
                     "dropout": dropout,
                     "survivors": survivors, "layer_index": index,
                     "encode_s": enc_plain, "encode_exact_s": enc_exact, "excess_s": excess, "protocol_s": seconds[False],
                     "protocol_exact_s": seconds[True], "removal_s": removal, "decode_s": decode,
                     "upload_ratio": up[True] / up[False], "sim_ratio": sim_exact / sim_plain,
                     "deploy_ratio": dep_exact / dep_plain,
                     "deploy_ratio_noise_ahead": (seconds[True] + removal + decode) / (seconds[False] + decode)})
    return rows


def noise_table(*, clients: int = 10, floor: int = 6, dim: int = 8192,
                dropouts: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4), mechanism: str = "skellam") -> list[dict]:
    """The noise a released sum really carries, over its target (z C)^2, with and without XNoise: the
    variance of the released sum's error over `dim` coordinates, end to end through `SecureAggregator`."""
    from dp.distributed import DistributedDPConfig
    from dp.ledger import Ledger, LedgerConfig
    from fl_algorithms.api import Masked, Upload
    from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator

    rng = np.random.default_rng(0)
    xs = {c: rng.normal(0, 0.01, dim) for c in range(1, clients + 1)}
    uploads = {c: Upload(masked={"a": Masked(x, weight=1.0)}) for c, x in xs.items()}
    rows = []
    for protocol in ("secagg+", "lightsecagg"):
        stage = "masked_input" if protocol == "lightsecagg" else "masked"
        params = {"target_survivors": floor} if protocol == "lightsecagg" else {}
        for dropout in dropouts:
            dropped = set(range(1, round(dropout * clients) + 1))
            ratios = {}
            for exact in (False, True):
                config = SecureAggregationConfig(protocol=protocol, protocol_params=params, distributed_dp=DistributedDPConfig(
                    l2_clip=1.0, noise_multiplier=1.0, expected_clients=clients, min_clients=floor, bits=20,
                    exact_noise=exact, mechanism=mechanism))
                view = SecureAggregator(config, ledger=Ledger(LedgerConfig(delta=1e-5))).aggregate(
                    round=1, uploads=uploads, drop_at={stage: dropped} if dropped else None)
                survivors = sorted(view.contributors)
                err = (view.mean("a") - np.mean([xs[c] for c in survivors], axis=0)) * len(survivors)
                ratios[exact] = float(err.var())
            rows.append({"mechanism": mechanism, "protocol": protocol, "clients": clients, "floor": floor, "dropout": dropout,
                         "survivors": clients - len(dropped), "floor_sized_ratio": ratios[False],
                         "exact_ratio": ratios[True], "floor_sized_expected": (clients - len(dropped)) / floor})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.xnoise_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="N, clients in the round (default 50)")
    parser.add_argument("--dim", type=float, default=1e6, help="d, values per client (default 1e6)")
    parser.add_argument("--floor-fraction", type=float, default=0.6,
                        help="n_min / N: the survivors the noise is sized for (default 0.6: 40%% dropout tolerated)")
    parser.add_argument("--dropouts", default="0,0.2", help="comma list of dropout rates below 1 - floor fraction")
    parser.add_argument("--encode-samples", type=int, default=2, help="clients whose encoding is timed (default 2)")
    parser.add_argument("--quick", action="store_true", help="N = 12, d = 1e4: a smoke run in seconds")
    parser.add_argument("--mechanism", choices=("skellam", "discrete_gaussian"), default="skellam",
                        help="the distributed DP noise (default skellam; discrete_gaussian: 16 equal-width units a client)")
    parser.add_argument("--noise", action="store_true",
                        help="instead: the released sum's noise over its target at 0-40%% dropout, with and without "
                             "XNoise (N = 10, n_min = 6, d = 8192; `xnoise_noise ...` lines)")
    args = parser.parse_args(argv)
    if args.noise:
        for row in noise_table(mechanism=args.mechanism):
            print("xnoise_noise " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in row.items()), flush=True)
        return 0
    clients, dim = (12, 10_000) if args.quick else (args.clients, int(args.dim))
    try:
        dropouts = [float(x) for x in args.dropouts.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--dropouts: not a comma list of numbers: {args.dropouts!r}")
    if clients < 3 or dim < 1 or not 0 < args.floor_fraction <= 1 or args.encode_samples < 1:
        parser.error("need --clients >= 3, --dim >= 1, 0 < --floor-fraction <= 1, --encode-samples >= 1")
    if any(not 0 <= p < 1 - args.floor_fraction + 1e-9 for p in dropouts):
        parser.error(f"every dropout must leave at least the floor: below {1 - args.floor_fraction:g}")
    for row in measure(clients=clients, dim=dim, floor_fraction=args.floor_fraction, dropouts=dropouts,
                       encode_samples=args.encode_samples, mechanism=args.mechanism):
        print("xnoise " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
