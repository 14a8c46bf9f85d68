# Self-documenting targets: `make help` lists them.
.DEFAULT_GOAL := help
UV := $(shell bash scripts/ensure-uv.sh)
SRC := packages/*/src tests-shared/src

.PHONY: help install demo lint format typecheck test bench docs

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: ## Install every workspace package and the dev tools into .venv
	$(UV) sync --all-packages --all-extras

demo: install ## Run the crash-and-resume demo on an embedded SQLite database
	$(UV) run stepcore demo

lint: install ## Check style with ruff
	$(UV) run ruff check .
	$(UV) run ruff format --check .

format: install ## Reformat with ruff
	$(UV) run ruff format .
	$(UV) run ruff check --fix .

typecheck: install ## Type-check the sources with pyright (strict)
	$(UV) run pyright

test: ## Start the test servers and run the whole suite
	bash scripts/test.sh

bench: install ## Run the step-persistence benchmark (writes bench/results.md)
	$(UV) run python bench/bench_steps.py

docs: install ## Build the documentation site strictly
	$(UV) run mkdocs build --strict
