#!/bin/bash
# One call on the lent GPU machine: set up the offline bundle (once per lease), run grid examples side
# by side on the GPU until SECONDS are spent, and bring every run directory back as one archive.
#
#   bash benchmarks/device_job.sh SECONDS SPEC [SPEC ...]
#   SPEC = "SCRIPT:WORKERS:RUN_DIR[:EXTRA ARGS][|RESUME ARGS]"   e.g. "atc_secure.py:6:docs/results/atc/full_h200:--full"
#
# A RUN_DIR that holds plan.json (carried from an earlier call: name it in `carry`) is
# resumed with RESUME ARGS (the FedNLP grid grows by --tasks/--algorithms/--partitions/--seeds there;
# other grids take none): its finished cells are skipped. Otherwise the grid starts there with EXTRA ARGS. Grids stop
# SECONDS after the start less a margin; cells they finished are kept (cells.jsonl), so the next call
# resumes them. Everything comes back as $OUT/runs.tgz (checkpoints, caches and claims left out), since
# the machine returns files only a few folders deep. Needs the bundle of `python -m benchmarks.offline_bundle`
# in .bundle/ (carry it).
set -u
BUDGET=$1; shift
T0=$(date +%s)
# shellcheck disable=SC1091
source .bundle/setup.sh >> "$OUT/setup.log" 2>&1  # unpacks once per lease, then only sets the environment
echo "setup: $(( $(date +%s) - T0 )) s"
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
nvidia-smi dmon -s u -d 15 > "$OUT/dmon.txt" 2>&1 &
DMON=$!
LEFT=$(( BUDGET - ($(date +%s) - T0) - 20 ))
echo "grids get $LEFT s"
pids=(); dirs=()
for spec in "$@"; do
  resume=""
  if [[ "$spec" == *"|"* ]]; then resume=${spec#*|}; spec=${spec%%|*}; fi
  IFS=':' read -r script workers run extra <<< "$spec"  # extra keeps its own colons (label:0.1)
  name=$(basename "$run")-$(basename "$script" .py)
  common=(--device cuda --workers "$workers" --threads 1 --no-progress)
  if [ -f "$run/plan.json" ]; then
    # shellcheck disable=SC2086
    (timeout "$LEFT" python3 "examples/$script" --resume "$run" "${common[@]}" ${resume:-} > "$OUT/$name.log" 2>&1
     echo "$name rc=$? after $(( $(date +%s) - T0 )) s") &
  else
    # shellcheck disable=SC2086
    (timeout "$LEFT" python3 "examples/$script" --out "$(dirname "$run")" --run-name "$(basename "$run")" \
       "${common[@]}" ${extra:-} > "$OUT/$name.log" 2>&1
     echo "$name rc=$? after $(( $(date +%s) - T0 )) s") &
  fi
  pids+=($!); dirs+=("$run")
done
wait "${pids[@]}"
kill "$DMON" 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude=checkpoints --exclude=cache --exclude=claims "${dirs[@]}"
for run in "${dirs[@]}"; do echo "$run: $(cat "$run/cells.jsonl" 2>/dev/null | wc -l) cells done"; done
for log in "$OUT"/*.log; do echo "== $log"; tail -n 3 "$log"; done
