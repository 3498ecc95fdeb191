# Two commands a new user needs: `make demo` (the main job on embedded defaults) and
# `make test` (the test suite; .ci/run calls it). Both install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test bench lint clean

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip 2>/dev/null || true
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import compaction, celery, fastapi, langgraph" 
	@touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/offpath demo

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) data .pytest_cache
