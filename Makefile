# Two entry points for a fresh machine: `make run` (the whole workflow on the
# embedded default) and `make test` (the test suite). Both install first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lenbatch-installed

.PHONY: run test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU build; a bare "torch" would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH snakemake --cores all

test: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q

clean:
	rm -rf results logs .snakemake

# The GPU path (issue 15). fla-test: flash-linear-attention's kernels on CPU under Triton's interpreter
# (needs flash-linear-attention and triton in $(VENV)). gpu-check: the prepared check for one GPU
# (about 8 minutes on an H200; refuses without CUDA), output under results/gpu-check/.
.PHONY: fla-test gpu-check
fla-test: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q tests/test_fla_cpu.py

gpu-check: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) benchmarks/gpu_check.py --out results/gpu-check
