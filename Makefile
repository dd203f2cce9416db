# The two commands of the README: `make run` (the gallery) and `make test` (the tests).
# Both build .venv on first use from requirements.lock (torch 2.14.1 + torchvision 0.29.1 pinned), with uv
# (installed into .venv by pip when the machine lacks it), or with pip where uv cannot be had.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900
ARGS ?=
# Idle OpenMP threads spin by default and steal the cores of the other ranks on a CPU launch.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: run test unit nbval notebooks bench lint venv clean-venv lock

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock tools/build_venv.py
	$(PYTHON) tools/build_venv.py --venv $(VENV) --lock requirements.lock --editable .
	touch $(STAMP)

## lock: rewrite requirements.lock from pyproject.toml (pins kept; UPGRADE="trl accelerate" moves those)
UPGRADE ?=
lock: $(STAMP)
	$(BIN)/python tools/build_venv.py --compile --venv $(VENV) $(foreach p,$(UPGRADE),--upgrade-package $(p))

## run: execute every notebook into runs/<stamp>/ and write the summary (ARGS="01 -p processes=1")
run: $(STAMP)
	$(BIN)/python -m helpers.gallery $(ARGS)

## test: lint, unit and launcher tests, papermill parameter runs, nbval over the stored notebooks
# The notebooks' MLflow logging is tested on its own (tests/test_gallery.py); off for the notebook runs here.
test: $(STAMP)
	$(BIN)/ruff check helpers tests benchmarks notebooks tools
	GALLERY_TRACKING=off $(BIN)/python -m pytest -p no:cacheprovider $(NBVAL) tests notebooks $(ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m "not notebook" tests $(ARGS)

nbval: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider $(NBVAL) notebooks $(ARGS)

## notebooks: re-execute notebooks at their defaults and store the outputs (NB="notebooks/01_ddp_mlp.ipynb")
NB ?= $(wildcard notebooks/[0-9][0-9]_*.ipynb)
notebooks: $(STAMP)
	$(BIN)/python -m helpers.execute --store $(NB)

bench: $(STAMP)
	$(BIN)/python benchmarks/launch_latency.py
	$(BIN)/python benchmarks/progress_overhead.py
	$(BIN)/python benchmarks/launcher_throughput.py

lint: $(STAMP)
	$(BIN)/ruff check helpers tests benchmarks notebooks tools

clean-venv:
	rm -rf $(VENV)
