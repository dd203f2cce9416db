# The two commands of the README: `make run` (the gallery) and `make test` (the tests); `make help` lists every
# target. Both build .venv on first use from requirements.lock (every pin, torch and torchvision among them), with
# uv (installed into .venv by pip when the machine lacks it), or with pip where uv cannot be had.
# A target's `## name: what it does` line is what `make help` prints.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# nbval compares under another instruction set and thread count than the stored run's (tests/plugins/nbval_variants.py)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900 \
	-p tests.plugins.nbval_variants
# On a GPU machine the regression suite still runs on CPU, the reference path the stored outputs come from
# (the GPU path has its own check); TEST_DEVICE=gpu runs the tests on the GPUs instead.
TEST_DEVICE ?= cpu
TEST_ENV := GALLERY_TRACKING=off $(if $(filter cpu,$(TEST_DEVICE)),CUDA_VISIBLE_DEVICES=,)
ARGS ?=
# Two pytest-xdist workers. Run alone, the tests leave a core idle much of the time (kernel starts, imports,
# process and Ray start-ups, waits on ranks); two already keep two cores busy. tests/plugins/xdist_scopes.py says
# what may overlap: a file runs on one worker (nbval's cells of a notebook share one kernel), and so do all tests
# that run Streaming, whose shared memory is machine-wide. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope -p tests.plugins.xdist_scopes)
# Idle OpenMP threads spin by default and steal the cores of the other ranks on a CPU launch.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help run test test-cluster mutation unit nbval notebooks bench docs lint venv venv-axolotl clean-venv clean-venv-axolotl \
	lock lock-axolotl gpu-check gpu-bundle

## venv: build .venv from requirements.lock (make run and make test do it on first use)
venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock tools/build_venv.py
	$(PYTHON) tools/build_venv.py --venv $(VENV) --lock requirements.lock --editable .
	touch $(STAMP)

## venv-axolotl: build .venv-axolotl, notebook 09's own environment, from envs/axolotl/requirements.lock
# Axolotl 0.13.2 pins TRL and datasets the gallery has moved past. axolotl is a source archive whose setup.py
# imports torch, so it is built without isolation, after the rest. The notebook's ranks run with this
# environment's interpreter (launch option python=).
AXOLOTL_VENV := .venv-axolotl
AXOLOTL_STAMP := $(AXOLOTL_VENV)/.installed
venv-axolotl: $(AXOLOTL_STAMP)

$(AXOLOTL_STAMP): envs/axolotl/requirements.lock tools/build_venv.py | $(STAMP)
	$(BIN)/python tools/build_venv.py --venv $(AXOLOTL_VENV) --lock envs/axolotl/requirements.lock --editable '' \
		--no-build-isolation axolotl
	touch $(AXOLOTL_STAMP)

## lock-axolotl: rewrite envs/axolotl/requirements.lock from envs/axolotl/requirements.in and its overrides
lock-axolotl: $(STAMP)
	$(BIN)/python tools/build_venv.py --compile --lock envs/axolotl/requirements.lock \
		--requirements envs/axolotl/requirements.in --overrides envs/axolotl/overrides.txt

## lock: rewrite requirements.lock from pyproject.toml (pins kept; UPGRADE="trl accelerate" moves those)
UPGRADE ?=
lock: $(STAMP)
	$(BIN)/python tools/build_venv.py --compile --venv $(VENV) $(foreach p,$(UPGRADE),--upgrade-package $(p))

## run: execute every notebook into runs/<stamp>/ and write the summary (ARGS="01 -p processes=1")
run: $(STAMP) $(AXOLOTL_STAMP)
	$(BIN)/python -m helpers.gallery $(ARGS)

## test: lint, unit and launcher tests, papermill parameter runs, nbval over the stored notebooks
# The notebooks' MLflow logging is tested on its own (tests/test_gallery_runner.py); off for the notebook runs here.
test: $(STAMP) $(AXOLOTL_STAMP)
	$(BIN)/ruff check helpers tests benchmarks notebooks tools
	$(TEST_ENV) $(BIN)/python -m pytest -p no:cacheprovider $(PARALLEL) -m "not mutation and not cluster" $(NBVAL) tests notebooks \
		$(ARGS)

## mutation: the slow tests of tests/test_check_mutations.py (each check fails on the bug it names)
mutation: $(STAMP) $(AXOLOTL_STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:cacheprovider $(PARALLEL) -m mutation tests/test_check_mutations.py $(ARGS)

## test-cluster: the two-node Ray cluster runs of the notebooks that make test leaves out (tests marked cluster)
test-cluster: $(STAMP) $(AXOLOTL_STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:cacheprovider $(PARALLEL) -m cluster tests $(ARGS)

## unit: the tests not marked `notebook` (no nbval, papermill, scale-up or mutation runs)
unit: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:cacheprovider $(PARALLEL) -m "not notebook" tests $(ARGS)

## nbval: nbval alone: re-execute every stored notebook and compare its outputs
nbval: $(STAMP) $(AXOLOTL_STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:cacheprovider $(PARALLEL) $(NBVAL) notebooks $(ARGS)

## notebooks: re-execute notebooks at their defaults and store the outputs (NB="notebooks/01_ddp_mlp.ipynb")
# Stored outputs are the CPU reference path, whatever the machine has; docs/benchmarks.md's notebook run times
# are then read from them again.
NB ?= $(wildcard notebooks/[0-9][0-9]_*.ipynb)
notebooks: $(STAMP) $(AXOLOTL_STAMP)
	$(TEST_ENV) $(BIN)/python -m helpers.gallery --store $(NB)
	$(BIN)/python benchmarks/write_docs.py --notebook-times

## bench: launch latency, progress-bar overhead, launcher throughput into docs/benchmarks.md (ARGS=--all)
# benchmarks/write_docs.py: also rewrites the page's notebook run times; ARGS="--only rank_gc" runs another.
bench: $(STAMP)
	$(BIN)/python benchmarks/write_docs.py $(ARGS)

## gpu-bundle: download the wheels the GPU machine lacks into gpu-bundle/ (tools/gpu_bundle.py; needs PyPI)
gpu-bundle: $(STAMP)
	$(BIN)/python tools/gpu_bundle.py

## gpu-check: on a GPU machine, every notebook's GPU path for a few steps; report in GPU_OUT (docs/gpu.md)
# No registry, no .venv there: the machine's own python3 plus the carried gpu-bundle/ (ARGS="--only 05",
# "--device cpu").
GPU_PYTHON ?= python3
GPU_OUT ?= runs/gpu-check
gpu-check:
	$(GPU_PYTHON) tools/gpu_check --out $(GPU_OUT) $(ARGS)

## docs: build the documentation site into site/ (MkDocs Material, strict: a broken link fails the build)
docs: $(STAMP)
	$(BIN)/python tools/build_docs.py

## lint: ruff over the package, tests, benchmarks, notebooks and tools
lint: $(STAMP)
	$(BIN)/ruff check helpers tests benchmarks notebooks tools

## clean-venv: remove .venv
clean-venv:
	rm -rf $(VENV)

## clean-venv-axolotl: remove .venv-axolotl
clean-venv-axolotl:
	rm -rf $(AXOLOTL_VENV)

## help: list the targets, each with what it does
help:
	@awk '/^## [a-z-]+: / { name = $$2; sub(/:$$/, "", name); $$1 = $$2 = ""; sub(/^ +/, ""); \
		printf "  %-20s %s\n", name, $$0 }' $(firstword $(MAKEFILE_LIST))
