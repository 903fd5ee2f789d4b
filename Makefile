.PHONY: demo test test-fast bench screenshots checks-doc
demo:            ## run diag on the bundled demo
	scripts/demo.sh
test:            ## run the full test suite (what CI runs)
	scripts/test.sh
test-fast:       ## run the fast tier (no end-to-end runs of training scripts)
	scripts/test.sh --fast
bench:           ## run the benchmark (figures for the README)
	scripts/setup.sh test && .venv/bin/python bench/run.py
screenshots:     ## regenerate screenshots/ from the real app
	scripts/setup.sh test && .venv/bin/python scripts/screenshots.py
checks-doc:      ## regenerate docs/checks.md from the registry
	scripts/setup.sh && .venv/bin/diag checks --format markdown > docs/checks.md
