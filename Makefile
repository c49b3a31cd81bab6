# `make demo` and `make test` create the virtual environment when missing,
# install rlplay with its extras (torch pinned to the CPU build by
# constraints.txt), then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,notebooks,demo,cluster,envpool,minari,video,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m rlplay.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/overlap.py
	$(BIN)/python benchmarks/episodes.py
	$(BIN)/python benchmarks/replay.py

clean:
	rm -rf $(VENV) build *.egg-info
