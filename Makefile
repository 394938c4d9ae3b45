# Two entry points for a fresh machine: `make run` (the whole workflow on the
# embedded default) and `make test` (the test suite). Both install first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lenbatch-installed

.PHONY: run plots test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU build; a bare "torch" would pull a multi-GB CUDA build.
	# The package itself asks only torch>=2.4 (a library must not replace its users' torch);
	# the exact pin lives here, and is repeated so no extra's resolution can move it.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]' torch==2.13.0
	touch $(STAMP)

# `dvc repro`: DVC decides what is stale and records it in dvc.lock; each stage runs its Snakemake
# rule, so Snakemake's records agree too (dvc status and snakemake -n are both clean afterwards).
run: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH dvc repro

# The DVC plots page (workspace vs HEAD) with Vega inlined: renders without network.
plots: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH lenbatch plots

test: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q

clean:
	rm -rf results logs .snakemake
