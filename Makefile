# `make demo`, `make test` and `make docs` create the virtual environment
# when missing, install rlplay with the extras they need (torch pinned to
# the CPU build by constraints.txt), then run. `make demo` needs the demo
# extra alone (tqdm); `make test` installs every extra the suite and the
# benchmarks use (Ray, EnvPool, Minari, PettingZoo, TorchRL, SB3, ALE,
# MuJoCo, JAX and gymnax, Jupyter, TensorBoard, MkDocs, build and
# twine..., then PufferLib's vector envs without their dependencies: a
# few GB);
# `make docs` the docs extra (MkDocs and its plugins), then builds the
# documentation into site/; `make dist` the release extra (build, twine),
# then builds the sdist and the wheel of a release into dist/ and checks
# them. Each has its stamp, so `make demo` then `make test` installs the
# rest.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
RELEASE_STAMP := $(VENV)/.installed-release
DOCS_STAMP := $(VENV)/.installed-docs
SITE ?= site
SETUP := setup.cfg pyproject.toml constraints.txt

.PHONY: demo test docs bench bench-torchrl dist clean

# the extras each stamp installs
EXTRAS_demo := demo
EXTRAS_test := test,notebooks,demo,tensorboard,release,cluster,envpool,minari,video,bench,atari,mujoco,jax,pettingzoo,torch-envs,docs
EXTRAS_release := release
EXTRAS_docs := docs
# and what a stamp installs after them without their dependencies:
# pufferlib-core, whose vector envs are peer rows of
# benchmarks/throughput.py, asks for torch==2.9.0 (and CUDA's libraries,
# for an extension the rows do not load), not the CPU build that
# constraints.txt pins; what its vector envs import (numpy, gymnasium,
# psutil) is in the bench extra. Pinned, as the dependencies it does not
# get are not checked: the rows drive its API (make, async_reset, send,
# recv) and a later version may change it or import more. Wheels only
# (its sdist builds the CUDA extension); where none fits this Python, the
# rows say that PufferLib is missing.
NODEPS_test := pufferlib-core==3.0.23

$(VENV)/.installed-%: $(SETUP)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS_$*)]'
	$(if $(NODEPS_$*),$(BIN)/python -m pip install -q --no-deps \
		--only-binary :all: '$(NODEPS_$*)' || echo '$(NODEPS_$*) \
		not installed (no wheel for this Python?): its rows say so')
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/python -m rlplay.demo

# two processes (pytest-xdist), as many as CI's cores: the tests spend
# much of their time waiting on workers, kernels and timeouts; every test
# on Ray runs in one of them, after its other tests (tests/conftest.py:
# the collection's order, which --no-loadscope-reorder keeps)
TEST_PROCESSES ?= 2

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadgroup \
		--no-loadscope-reorder

# strict: a broken link, anchor or cross-reference fails the build
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir $(SITE)

bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/overlap.py
	$(BIN)/python benchmarks/prefetch.py
	$(BIN)/python benchmarks/episodes.py
	$(BIN)/python benchmarks/replay.py
	$(BIN)/python benchmarks/gpu.py

# TorchRL's prioritized sampler is a C++ extension that loads only with the
# torch its wheel was built against (torchrl 0.14.1: torch 2.14.1), not with
# the CPU build pinned above; this target runs benchmarks/replay.py, every
# row, in an environment of its own with that torch (a CUDA wheel of a few
# GB: never installed by `make test`).
TORCHRL_VENV ?= .venv-torchrl
TORCHRL_TORCH ?= torch==2.14.1

bench-torchrl:
	test -x $(TORCHRL_VENV)/bin/python || $(PYTHON) -m venv $(TORCHRL_VENV)
	grep -v '^torch==' constraints.txt > $(TORCHRL_VENV)/constraints.txt
	echo '$(TORCHRL_TORCH)' >> $(TORCHRL_VENV)/constraints.txt
	$(TORCHRL_VENV)/bin/python -m pip install -q -c $(TORCHRL_VENV)/constraints.txt -e '.[bench]'
	$(TORCHRL_VENV)/bin/python benchmarks/replay.py

# built in an isolated environment (what pyproject.toml's build-system
# names), as an index builds it; tests/test_wheel.py builds without one
dist: $(RELEASE_STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

clean:
	rm -rf $(VENV) $(TORCHRL_VENV) build dist *.egg-info $(SITE)
