# Two commands a new user needs: `make demo` (the main job on embedded defaults) and
# `make test` (the test suite; .ci/run calls it). Both install what they need first.
#
# Installs use uv (PyPI's `uv`) from the versions locked in uv.lock: `uv sync --locked`
# creates .venv/ with $(PYTHON) and installs exactly the locked versions (the project itself
# editable, with its dev extra), and refuses a uv.lock that no longer matches pyproject.toml.
# --compile-bytecode writes the packages' .pyc files once: with PYTHONDONTWRITEBYTECODE set
# (CI hosts set it) every process would otherwise compile LangChain from source at each start
# (6 s of CPU per API or worker process instead of 2.5 s).
# A uv on PATH is used if it is at least UV_MIN; otherwise `make` installs UV_VERSION from
# PyPI into .uv/ (pip's --target: the user's Python and its packages are left alone).
PYTHON     ?= python3
VENV       := .venv
BIN        := $(VENV)/bin
UV_VERSION := 0.13.9
UV_MIN     := 0.13.0
ifndef UV
UV := $(shell v=$$(uv --version 2>/dev/null | cut -d' ' -f2); \
	if [ -n "$$v" ] && printf '%s\n' $(UV_MIN) "$$v" | sort -V -C; then command -v uv; \
	else echo .uv/bin/uv; fi)
endif
# the interpreter is $(PYTHON), never one uv downloads (python-build-standalone is not on PyPI)
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
UV_SYNC := $(UV) sync --locked --extra dev --compile-bytecode --python $(PYTHON)
UV_PIP_FLAGS := --quiet --disable-pip-version-check --root-user-action=ignore --no-warn-script-location

.PHONY: install demo test bench lint lock clean

.uv/bin/uv:
	@echo "installing uv $(UV_VERSION) from PyPI into .uv/ (none on PATH, or older than $(UV_MIN)) ..."
	@rm -rf .uv
	@# pip's --target (its binary lands in .uv/bin), or, for a Python without pip, a venv's pip
	@$(PYTHON) -m pip install $(UV_PIP_FLAGS) --target .uv uv==$(UV_VERSION) 2>/dev/null \
		|| { rm -rf .uv && $(PYTHON) -m venv .uv && .uv/bin/python -m pip install $(UV_PIP_FLAGS) uv==$(UV_VERSION); }

$(BIN)/.installed: pyproject.toml uv.lock | $(UV)
	@echo "installing offpath and the versions uv.lock pins into $(VENV): $(UV_SYNC)"
	@$(UV_SYNC) > .uv-sync.log 2>&1 || { cat .uv-sync.log; echo "uv sync failed (uv.lock out of date after a change to pyproject.toml? make lock)"; exit 1; }
	@grep -E '^(Using|Creating|Resolved|Prepared|Installed|Uninstalled|Audited) ' .uv-sync.log || true
	@mv .uv-sync.log $(VENV)/install.log
	@$(BIN)/python -c "import offpath.api.app, offpath.worker.tasks"
	@touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/offpath demo

test: install
	$(BIN)/python -m pytest

# the bench extra too (bench/peers.py's peers and its offline tokenizer); `install` leaves it out
bench: install
	$(UV_SYNC) --extra bench > $(VENV)/install-bench.log 2>&1 || { cat $(VENV)/install-bench.log; exit 1; }
	$(BIN)/python -m bench

# mypy on the product as installed (offpath with api/ and worker/ mapped under it), through
# the test that CI runs too (tests/test_types.py: its configuration is pyproject.toml's)
lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/python tests/test_types.py

# uv.lock pins every package `install` puts in the venv, for every platform (so CI, `make
# bench` and the Dockerfile install the same versions). After changing dependencies in
# pyproject.toml, run `make lock`: it resolves them again, keeping every locked version the
# new bounds still allow (`$(UV) lock --upgrade` takes the newest the bounds allow, and
# `--upgrade-package NAME` one package's); then `make install` installs what changed.
lock: | $(UV)
	$(UV) lock --python $(PYTHON)

clean:
	rm -rf $(VENV) .uv data .pytest_cache
