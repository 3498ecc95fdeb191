# Two commands a new user needs: `make demo` (the main job on embedded defaults) and
# `make test` (the test suite; .ci/run calls it). Both install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test bench lint clean

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip 2>/dev/null || true
	@echo "installing offpath and its dependencies into $(VENV) (log: $(VENV)/install.log) ..."
	@$(BIN)/python -m pip install --disable-pip-version-check -e '.[dev]' > $(VENV)/install.log 2>&1 \
		|| { tail -n 30 $(VENV)/install.log; echo "pip install failed (full log: $(VENV)/install.log)"; exit 1; }
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
