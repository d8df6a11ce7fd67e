# `make repro` runs the full pipeline on Fashion-MNIST; `make test` runs the test suite.
# `make lint` runs ruff on the whole repository (as .ci/run does). All run the idempotent set-up first (dataset package, .venv, dvc).
SHELL := /bin/bash
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export DVC_NO_ANALYTICS := 1
export GX_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := 1

.PHONY: setup repro test lint bench-data mlflow-ui team-server clean-outputs

setup:
	@bash scripts/setup.sh

# `make repro PROFILE=quick DATA=imagefolder:/path/to/images`: the pipeline as a DVC experiment with a
# profile's settings (profiles/<name>.yaml) and your own data (python -m pipeline.profiles --help).
# Plain `make repro` is `dvc repro` (its caching and exit status), after the same params check, with the
# same per-stage progress lines.
PROFILE ?=
DATA ?=
repro: setup
ifeq ($(PROFILE)$(DATA),)
	python -m pipeline.profiles --repro
else
	python -m pipeline.profiles $(if $(PROFILE),--profile $(PROFILE)) $(if $(DATA),--data '$(DATA)')
endif

# -n auto: one pytest-xdist worker per core; --dist loadfile: a module's tests run on one worker, in order, as its
# module-scoped fixtures assume (the team server's registry test reads what the test before it registered)
test: setup
	python -m pytest -q -n auto --dist loadfile --durations=15

lint: setup
	ruff check .

bench-data: setup
	python -m bench.data_stages

mlflow-ui: setup
	mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000

# The team tracking server (PostgreSQL store, proxied artifacts): `make team-server` starts it and
# prints the MLFLOW_TRACKING_URI to export; `make team-server TEAM_SERVER=stop` (or status) and
# TEAM_SERVER_ARGS="--port 5050 --dir /srv/mlflow" choose the action and where it lives.
TEAM_SERVER ?= start
team-server: setup
	bash scripts/team_server.sh $(TEAM_SERVER) $(TEAM_SERVER_ARGS)
