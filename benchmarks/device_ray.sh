#!/bin/bash
# Ray on the offline GPU host, over three consecutive calls of one warm lease (Ray's wheel is larger than
# what one call carries). Build the parts here first: python -m benchmarks.offline_bundle --ray --out .bundle_ray
#
#   bash benchmarks/device_ray.sh a          carry .bundle_ray/a : the wheel's first part to /tmp/raywhl
#   bash benchmarks/device_ray.sh b          carry .bundle_ray/b : its second part and the dependencies;
#                                            joins the wheel and installs Ray under /tmp/rayprefix (pip
#                                            --prefix: only the dependencies the host lacks are added)
#   bash benchmarks/device_ray.sh run ARGS   carry .bundle       : the offline bundle, then
#                                            python -m benchmarks.ray_speedup ARGS (log in $OUT)
set -eu
W=/tmp/raywhl
case "${1:-}" in
  a) mkdir -p $W && cp .bundle_ray/a/* $W/ && ls -la $W ;;
  b) cp .bundle_ray/b/* $W/
     for first in $W/*.whl.part0; do
       cat "$first" "${first%.part0}.part1" > "${first%.part0}" && rm "$first" "${first%.part0}.part1"
     done
     python3 -m pip install -q --no-index --find-links $W --no-compile --prefix /tmp/rayprefix ray 2>&1 | tail -5
     PYTHONPATH=$(echo /tmp/rayprefix/lib/python3*/site-packages) python3 -c "import ray; print('ray', ray.__version__)" ;;
  run) shift
     # shellcheck disable=SC1091
     source .bundle/setup.sh >> "$OUT/setup.log" 2>&1  # unpacks once per lease, then only sets the environment
     set -eu
     PYTHONPATH=$PYTHONPATH:$(echo /tmp/rayprefix/lib/python3*/site-packages)
     nproc; date -u
     python3 -m benchmarks.ray_speedup "$@" 2>&1 | tee "$OUT/ray_speedup.log" | tail -n 20 ;;
  *) echo "usage: bash benchmarks/device_ray.sh a | b | run [ray_speedup args]" >&2; exit 2 ;;
esac
