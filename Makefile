# Two entry points for a fresh machine: `make run` (the whole workflow on the
# embedded default) and `make test` (the test suite). Both install first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lenbatch-installed

.PHONY: run plots test test-fast test-deps install clean lint format

# DVC's own `dvc plots show/diff` use this template (.dvc/config: plots.html_template): Vega inlined from
# Snakemake's bundled copies, so the page renders offline. Written here, not committed (2.2 MB of third-party code).
PLOTS_TEMPLATE := .dvc/offline-plots.html

install: $(STAMP) $(PLOTS_TEMPLATE)

# Packages go in with uv (pip-compatible; pip puts it into the venv first): on a fresh clone of this 2-core
# VM with no cache, the ~170 dev packages took 46 s where pip took 104 s, and the CPU torch wheel 25 s where
# pip took 33-39 s, byte-code included. uv reads no pip.conf, so the find-links pip is configured with (where
# a machine keeps its own torch wheel, as this one does) are passed on; behind a private index set
# UV_INDEX_URL, or install with pip alone: `make INSTALLER=pip`. Byte-code is compiled at install, as pip
# does: where PYTHONDONTWRITEBYTECODE=1 is set (this VM and CI set it) Python never writes it, and every
# process of the suite and the workflow would compile torch's imports from source again.
INSTALLER ?= uv
UV := $(VENV)/bin/uv
ifeq ($(INSTALLER),pip)
pip_install = $(1) -m pip install -q
INSTALL_TOOL :=
else
pip_install = UV_FIND_LINKS="$$($(PY) -m pip config get global.find-links 2>/dev/null)" $(UV) pip install -q --compile-bytecode --python $(1)
INSTALL_TOOL := $(UV)
endif

# The bare venv is its own target: the fla venv needs only it (its .pth names this venv's site-packages),
# so `make -j` (.ci/run) downloads fla's triton while this venv installs.
$(PY):
	python3 -m venv $(VENV)
	$(if $(INSTALL_TOOL),,$(PY) -m pip install -q --upgrade pip)

# its own target too, so a venv made before uv was used gets it
$(UV): | $(PY)
	$(PY) -m pip install -q uv

$(STAMP): pyproject.toml study/pyproject.toml | $(PY) $(INSTALL_TOOL)
	# torch first, pinned: the CPU build; a bare "torch" would pull a multi-GB CUDA build.
	# The package itself asks only torch>=2.4 (a library must not replace its users' torch);
	# the exact pin lives here, and is repeated so no extra's resolution can move it.
	$(call pip_install,$(PY)) torch==2.13.0
	# the library and the study side by side, in one resolution (so the study's "lenbatch" is this tree's)
	$(call pip_install,$(PY)) -e . -e './study[dev]' torch==2.13.0
	touch $(STAMP)

$(PLOTS_TEMPLATE): $(STAMP) src/lenbatch_study/tools/plots.py
	PATH=$(abspath $(VENV))/bin:$$PATH lenbatch plots --write-template

# `dvc repro`: DVC decides what is stale (by content) and records it in dvc.lock; each stage runs its one
# Snakemake rule, which records that job. `snakemake --touch` then records the jobs DVC skipped (a fresh
# clone has no Snakemake records and its file times are the checkout's): truthful only here, right after
# `dvc repro` succeeded, when DVC has just checked every output against dvc.lock (make stops before it
# otherwise), and with the profile's rerun-incomplete, so an interrupted job whose previous output DVC
# verified is recorded too. Then `dvc status` and `snakemake -n` are both clean. After `git checkout REV
# && dvc checkout`, `make run` again: DVC reruns what differs, touch records the rest.
run: install
	PATH=$(abspath $(VENV))/bin:$$PATH dvc repro
	PATH=$(abspath $(VENV))/bin:$$PATH snakemake --touch --cores 1
	@# the README's results table, where the README has one (this repository's; a copy of the workflow may not)
	@if grep -qs 'written by `lenbatch readme`' README.md; then PATH=$(abspath $(VENV))/bin:$$PATH lenbatch readme; fi

# The DVC plots page (workspace vs HEAD) with Vega inlined: renders without network.
plots: install
	PATH=$(abspath $(VENV))/bin:$$PATH lenbatch plots

# Two pytest-xdist workers, by file (tests/conftest.py says why and orders them).
# TEST_WORKERS=0 runs the suite in one process.
# test-deps: everything the suite needs installed (its parts are added below, next to their rules);
# `make -j3 test-deps` (.ci/run) builds the independent ones side by side.
TEST_WORKERS ?= 2
test-deps: install
test: test-deps
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The contributors' inner loop: the suite without the tests marked slow (torchrun, the whole workflow, the
# GPU-check rehearsal), on the main venv alone.
test-fast: install
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

# the linter and the format check (pyproject.toml's [tool.ruff]); the suite runs both (tests/pipeline/test_lint.py)
lint: install
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/ruff format --check src tests benchmarks tools

# rewrites every Python file as the format check (make lint, tests/pipeline/test_lint.py) wants it
format: install
	$(VENV)/bin/ruff format src tests benchmarks tools

clean:
	rm -rf results logs .snakemake

# The GPU path. flash-linear-attention's kernels run on CPU under Triton's interpreter in
# a second venv layered on $(VENV) (a .pth adds its site-packages): importing fla changes transformers'
# kernels and adds seconds to every process, so the main venv stays without it; tests/models/test_fla_cpu.py
# runs its fla checks with $(FLA_VENV)/bin/python (skipped, with the reason, where it is absent).
FLA_VENV ?= .venv-fla
FLA_STAMP := $(FLA_VENV)/.lenbatch-fla-installed
FLA_PINS := flash-linear-attention==0.6.0 fla-core==0.6.0 triton==3.9.0 einops==0.8.2
.PHONY: fla-check gpu-check gpu-wheels gpu-rehearse
test-deps: $(FLA_STAMP)

$(FLA_STAMP): | $(PY) $(INSTALL_TOOL)
	python3 -m venv $(if $(INSTALL_TOOL),--without-pip) $(FLA_VENV)
	$(FLA_VENV)/bin/python -c "import site, sys; open(site.getsitepackages()[0] + '/lenbatch-main-venv.pth', 'w').write('import site; site.addsitedir(%r)\n' % sys.argv[1])" "$$($(PY) -c 'import site; print(site.getsitepackages()[0])')"
	$(call pip_install,$(FLA_VENV)/bin/python) --no-deps $(FLA_PINS)
	touch $(FLA_STAMP)

# fla's CPU checks alone (they also run in make test)
fla-check: $(FLA_STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q tests/models/test_fla_cpu.py

# The GPU check runs on a GPU machine as it is: its own python3, no venv, no package index.
# What it lacks travels in the kit $(GPU_KIT)/ (git-ignored; under 40 MiB): pure-Python wheels of
# flash-linear-attention/fla-core/einops and the check's pre-tokenized data, built here by
# `make gpu-wheels` (needs the index and the data extras). `make gpu-check` there installs the wheels
# with --no-index into results/gpu-check/site and runs lenbatch from the tree (a critical path of about
# 5 1/2 of its 9 minutes on one H200; benchmarks/gpu_check.py). Where the machine has no `make` (the GPU
# image has CMake and ninja), the same check is `python3 benchmarks/gpu_check.py --out results/gpu-check
# --kit .whl`; add `--collect DIR` to get the summary and every log in one folder (a device's output folder). `make gpu-rehearse` (and `make test`) runs every step of it on CPU
# in $(GPU_VENV): a stand-in for that machine's Python (its triton 3.6.0 and transformers 5.17.0, the
# main venv's CPU torch, none of the project's extras; benchmarks/gpu_env.py).
GPU_KIT ?= .whl
KIT_STAMP := $(GPU_KIT)/.built
GPU_VENV ?= .venv-gpu
GPU_STAMP := $(GPU_VENV)/.lenbatch-gpu-env
test-deps: $(GPU_STAMP) $(KIT_STAMP)

gpu-wheels: $(STAMP)
	$(PY) benchmarks/gpu_check.py --build-kit --kit $(GPU_KIT)
	touch $(KIT_STAMP)

$(KIT_STAMP): $(STAMP) benchmarks/gpu_check.py
	$(PY) benchmarks/gpu_check.py --build-kit --kit $(GPU_KIT)
	touch $(KIT_STAMP)

$(GPU_STAMP): $(STAMP) benchmarks/gpu_env.py | $(INSTALL_TOOL)
	$(PY) benchmarks/gpu_env.py --venv $(GPU_VENV) --installer $(INSTALLER)

gpu-check:
	@test -d $(GPU_KIT) || { echo "gpu-check: no kit $(GPU_KIT)/ (wheels + pre-tokenized data) in this tree; build it with 'make gpu-wheels' on a machine with a package index, then send the tree with $(GPU_KIT)/" >&2; exit 2; }
	python3 benchmarks/gpu_check.py --out results/gpu-check --kit $(GPU_KIT)

# the deadline of the CPU rehearsal: the steps after compare start only if their H200 estimate fits in what
# is left, so a slow, shared CPU (631 s here under 5 other engineers' load) needs room to reach them
gpu-rehearse: $(GPU_STAMP) $(KIT_STAMP)
	env -u PYTHONPATH -u VIRTUAL_ENV $(GPU_VENV)/bin/python benchmarks/gpu_check.py --rehearse --kit $(GPU_KIT) --out build/gpu-rehearsal --budget-s 1500

# The SLURM path for real (tools/slurm_check.py): a 2-node SLURM cluster with accounting started on this
# machine (tools/slurm_cluster.py: Debian's slurm-wlm, munge, slurmdbd + MariaDB, in a private network
# namespace; needs root, installs with apt-get when missing), the tiny workflow run on it with
# profiles/slurm (every rule a SLURM job; the packed training requeued while it runs, so that it resumes
# from its checkpoint) and locally, compared (edges, plans, batch hashes, losses);
# results/slurm-check/summary.json lists every job as sacct reported it. The cluster is stopped at the end
# whatever happened. About 3-6 minutes on 2 cores. docs/slurm.md.
.PHONY: slurm-check slurm-deps
slurm-check: install
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) tools/slurm_check.py --out results/slurm-check

# the packages, for the suite's SLURM check (tests/slurm/): installed where root and apt-get are, else a
# one-line note and the test skips
test-deps: slurm-deps
slurm-deps:
	python3 tools/slurm_cluster.py install --if-possible

# Debian's Chromium for the plots page's browser test (tests/pipeline/_browser.py), where root and apt-get
# are (elsewhere the test skips, naming the package). After slurm-deps: one apt-get at a time.
.PHONY: browser-deps
test-deps: browser-deps
browser-deps: | slurm-deps
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	fi
