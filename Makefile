# A thin index over scripts/, the build (python -m training) and the lab (python -m lab): each
# target is one command a person can also run by hand.
VENV      ?= .venv
PY        := $(VENV)/bin/python
# The lab's tools: `python -m lab NAME` (`python -m lab` lists them); the targets below call them.
LAB       := $(PY) -m lab
STAMP     := $(VENV)/.installed
MODEL_DIR ?= build/bert-sentiment
MODEL_CONFIG ?= config/model-config.yaml
# PRECISION=fp32 (or bf16, fp16, tf32, auto) packs MODEL_CONFIG with handler.precision replaced; without
# it the config is packed as written. The .mar's source stamp follows either way.
PRECISION ?=
MAR       := model_store/bert.mar
MAR_SOURCE = $(MAR).source
# REFERENCE=texts.txt (one text a line): their profile is packed in the .mar and exported for the
# drift rules (docs/operating/README.md). The default model's: its held-out reviews.
DEFAULT_REFERENCE := build/reference-reviews.txt
REFERENCE ?= $(if $(filter build/bert-sentiment build/bert-sentiment/,$(MODEL_DIR)),$(DEFAULT_REFERENCE))
PACKAGE    = $(PY) -m bert_serve_server package --model-dir $(MODEL_DIR) --model-config $(MODEL_CONFIG) --export-path $(dir $(MAR)) $(if $(PRECISION),--precision $(PRECISION)) $(if $(REFERENCE),--reference $(REFERENCE))
STATE_DIR ?= .run
# TORCH=cpu (default for a new venv) or cuda: the torch build of `make install` and `make image`;
# TORCH_INDEX=<index> where it comes from (scripts/torch_build.sh). Unset, `make install` keeps
# the venv's build. Both travel to the scripts through the environment.
TORCH ?=
LOCK      := requirements/server.lock

.PHONY: install lock model package serve stop status metrics smoke test test-client unit check bench check-defaults gpu-report compare-precision chaos soak fuzz deploy-layout image image-test pod-test models-start clean distclean FORCE

## install: .venv with the server and dev extras at the versions of requirements/server.lock
##        (TORCH=cuda for the CUDA build of torch; the CPU build otherwise)
install:
	@[ -z "$(TORCH)" ] || [ "$$(cat $(VENV)/.torch-build 2>/dev/null)" = "$(TORCH)" ] || rm -f $(STAMP)
	@$(MAKE) --no-print-directory $(STAMP)

$(STAMP): pyproject.toml server/pyproject.toml $(LOCK) requirements/excludes.txt scripts/install.sh scripts/torch_build.sh
	TORCH=$(TORCH) bash scripts/install.sh $(VENV)
	touch $@

## lock: resolve pyproject's server and dev extras afresh into requirements/server.lock and
##        print what changed (then `make install` and `make test` before committing it)
lock:
	bash scripts/lock.sh

# The venv is an order-only prerequisite (after |): reinstalling must not retrain or repackage.
build/bert-sentiment/config.json: $(wildcard training/*.py scripts/data/*.tsv) | $(STAMP)
	$(PY) -m training model --out build/bert-sentiment

model: build/bert-sentiment/config.json

$(DEFAULT_REFERENCE): training/__init__.py training/__main__.py scripts/data/reviews.tsv | $(STAMP)
	$(PY) -m training reference --out $@

# The .mar follows what it was built from, not file times alone: this stamp records the model
# folder (its files' sizes and times) and the handler config (its hash), and is rewritten only
# when they differ from the last build, e.g. another MODEL_DIR, even one older than the .mar.
$(MAR_SOURCE): $(MODEL_DIR)/config.json $(REFERENCE) FORCE | $(STAMP)
	@$(PACKAGE) --stamp-only

# --checked: the stamp's recipe, which always runs first, has just checked the folder (or found
# it unchanged since it was checked and packaged by the handler's current code).
$(MAR): $(MAR_SOURCE) handler/*.py server/bert_serve_server/archive.py | $(STAMP)
	$(PACKAGE) --checked

## package: rebuild the .mar (MODEL_DIR=path/to/hf-folder to serve your own model;
##        NAME=toxicity VERSION=2: model_store/toxicity.mar of that name and version;
##        REFERENCE=texts.txt: pack the model's profile on those texts for the drift alerts)
package: $(STAMP) $(MODEL_DIR)/config.json $(REFERENCE)
	$(PACKAGE) $(if $(NAME),--name $(NAME)) $(if $(VERSION),--version $(VERSION))

## serve: install, build, package, start TorchServe and wait until the model is READY
##        (PRECISION=fp32: IEEE fp32 pinned; the default auto: docs/configuration.md)
##        MODELS="sentiment=DIR toxicity:2=DIR2": several models on one server (docs/models.md)
serve:
	@bash scripts/check_java.sh
ifeq ($(strip $(MODELS)),)
	@$(MAKE) --no-print-directory $(MAR)
	$(PY) -m bert_serve_server start --state-dir $(STATE_DIR)
else
	@$(MAKE) --no-print-directory $(STAMP)
	$(PY) -m bert_serve_server start --state-dir $(STATE_DIR) --models "$(MODELS)" \
	  --model-config $(MODEL_CONFIG) $(if $(PRECISION),--precision $(PRECISION))
endif

stop:
	@if [ -x $(PY) ]; then $(PY) -m bert_serve_server stop --state-dir $(STATE_DIR); fi

status:
	$(PY) -m bert_serve_server status --state-dir $(STATE_DIR)

## metrics: a live summary of the handler's metrics of the `make serve` server (60 s)
metrics:
	$(PY) -m bert_serve_server metrics --state-dir $(STATE_DIR)

## smoke: curl smoke tests against the server `make serve` started
smoke:
	VENV_PYTHON=$(PY) bash scripts/smoke.sh $(STATE_DIR)

## test: the whole suite: unit, integration (a real torchserve on free ports) and curl smoke
test: $(MAR)
	bash scripts/test.sh

## test-client: the client's unit tests on every Python it supports (3.9 to 3.13), each in
##        a clean venv with the wheel `pip install .` builds, side by side (PYTHONS="3.9 3.12" for some)
test-client:
	bash scripts/test_client_pythons.sh

## bench: served vs batch size 1 vs in-process ceiling vs LitServe vs client list requests -> docs/bench/
##        (DEVICE=cpu or cuda: where workers and in-process runs compute; default cuda if present)
bench: $(MAR) | $(STAMP)
	$(LAB) bench --out docs/bench $(if $(DEVICE),--device $(DEVICE))

## gpu-report: on a GPU host, the default start (each level 3 x 3 s), workers per GPU swept
##        around the rule's choice, fp32 pinned against the CPU, LitServe like ours, batchSize 1,
##        the lone request, tf32 and the ceiling on a bert-base-shaped model -> docs/gpu/
##        (SMOKE=1: the CPU, a tiny model, every section, about 4 minutes on 2 cores ->
##        build/gpu-smoke/; it fails if a section fails; docs/gpu/README.md runs it on a lent GPU)
gpu-report: | $(STAMP)
	$(LAB) gpu-report $(if $(SMOKE),--smoke --out build/gpu-smoke,--out docs/gpu)

## check-defaults: the shipped defaults on the default model and on stand-ins for faster and
##        slower hardware: patient clients never refused, stated deadlines pay -> docs/bench/defaults.json
check-defaults: $(MAR) | $(STAMP)
	$(LAB) check-defaults --out docs/bench

## compare-precision: fp32 vs PRECISION (default bf16; tf32 or fp16 on CUDA) on TEXTS (one per
##        line; default the corpus) with MODEL_DIR: texts/s, largest score change, flipped
##        labels -> build/
compare-precision: $(STAMP) $(MODEL_DIR)/config.json
	$(LAB) compare-precision --model-dir $(MODEL_DIR) --model-config $(MODEL_CONFIG) \
	  --precision $(or $(filter-out fp32,$(PRECISION)),bf16) $(if $(TEXTS),--texts $(TEXTS)) \
	  --out build/compare-precision.json

## chaos: faults and overload against a real server -> docs/chaos/chaos.json
chaos: $(MAR) | $(STAMP)
	$(LAB) chaos --out docs/chaos

## fuzz: schemathesis from docs/openapi.yaml against a real server, 5 minutes -> docs/fuzz/fuzz.json
fuzz: $(MAR) | $(STAMP)
	$(LAB) fuzz --max-examples 500 --max-time 300 --out docs/fuzz

## soak: 10 minutes of steady mixed traffic: RSS, rps and log growth -> docs/soak/
soak: $(MAR) | $(STAMP)
	$(LAB) soak --out docs/soak

## deploy-layout: the container / KServe layout (config/ + model-store/) -> build/kserve
##        (MODELS="sentiment=DIR toxicity=DIR2": a model store of several models)
deploy-layout: $(if $(strip $(MODELS)),,$(MAR)) | $(STAMP)
	$(PY) -m bert_serve_server layout --out build/kserve $(if $(strip $(MODELS)),--models "$(MODELS)")

## image: the container image (deploy/Dockerfile) and the proxy's (deploy/proxy/, PROXY_IMAGE=...)
##        with podman or docker; prints their sizes and the server image's parts
##        (IMAGE=name:tag, BASE_IMAGE=..., TORCH=cuda for the GPU variant, TORCH_INDEX=...,
##        MODELS="sentiment=DIR toxicity=DIR2" for a model store of several models)
IMAGE ?= bert-serve:0.1.0
PROXY_IMAGE ?= bert-serve-proxy:0.1.0
IMAGE_TEST_OUT ?= build/image/image-test.json
image: $(if $(strip $(MODELS)),,$(MAR)) | $(STAMP)
	IMAGE=$(IMAGE) PROXY_IMAGE=$(PROXY_IMAGE) VENV_PYTHON=$(PY) MODELS="$(MODELS)" bash scripts/image.sh

## image-test: run that image: READY, the README's requests, /metrics, memory, SIGTERM -> build/image/
##        (MEASURED=DIR: its first container starts on what pod-test kept there)
image-test: | $(STAMP)
	$(LAB) image-test --image $(IMAGE) --out $(IMAGE_TEST_OUT) $(if $(MEASURED),--measured $(MEASURED))

## pod-test: the Deployment as one pod (podman kube play: both containers, limits, Secret,
##        ConfigMap, read-only roots), through the proxy: patient clients, a killed frontend,
##        SIGTERM under new connections with 1 and 2 workers -> build/image/pod-test.json
##        (MEASURED=DIR: what its first pod's start measured is copied there)
POD_TEST_OUT ?= build/image/pod-test.json
pod-test: | $(STAMP)
	$(LAB) pod-test --image $(IMAGE) --proxy-image $(PROXY_IMAGE) --out $(POD_TEST_OUT) \
		$(if $(MEASURED),--keep-measured $(MEASURED))

## models-start: an image of three models (the default one under three names) started with the
##        pod's CPUs and the memory three workers need: seconds until the startup probe passes
##        -> build/image/models-start.json (deploy/models-start.json is the committed record)
MODELS_START_OUT ?= build/image/models-start.json
models-start: $(MAR) | $(STAMP)
	$(MAKE) --no-print-directory image IMAGE=bert-serve-models:test MODELS="bert=$(MODEL_DIR) second=$(MODEL_DIR) third=$(MODEL_DIR)"
	$(LAB) models-start --image bert-serve-models:test --models 3 --out $(MODELS_START_OUT)

## unit: the fast layer, no server (every test not marked integration)
unit: $(STAMP)
	$(PY) -m pytest -m "not integration" -q -n auto --maxprocesses 4

check: $(STAMP)
	$(VENV)/bin/ruff check handler bert_serve server lab training scripts tests deploy/grafana deploy/prometheus
	$(VENV)/bin/ruff format --check handler bert_serve server lab training scripts tests deploy/grafana deploy/prometheus
	$(VENV)/bin/mypy
	@# The client supports 3.9: mypy checks it as far back as mypy goes (test-client runs it on 3.9).
	$(VENV)/bin/mypy --python-version 3.10 bert_serve
	@echo "pip-audit of $(LOCK) (packages it could not look up are listed as skipped, not as safe):"
	$(VENV)/bin/pip-audit -r $(LOCK) --no-deps --disable-pip --progress-spinner off

clean: stop
	rm -rf build $(STATE_DIR) model_store/*.mar model_store/*.mar.source model_store/*.mar.model-config.yaml .pytest_cache

distclean: clean
	rm -rf $(VENV)
