# Thin wrappers around ./go, which does the real work (and needs no make).
.PHONY: demo test quick-test setup bench-% clean
demo:       ; ./go demo
test:       ; ./go test
quick-test: ; ./go quick-test
setup:      ; ./go setup
bench-%:    ; ./go bench $*
clean:      ; rm -rf .venv out test-artifacts .pytest_cache
