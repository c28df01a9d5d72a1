# The two set-up commands: `make demo` and `make test`. Both work offline on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ./clients/python -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

demo: $(STAMP)
	$(VENV)/bin/sapiens2-stream --config configs/demo.yaml

# CPU figures of docs/PERFORMANCE.md (minutes; run on an otherwise idle machine).
bench: $(STAMP)
	$(PY) bench/bench_pose_cpu.py --wait-quiet 60
	$(PY) bench/bench_stages.py --config medium --tasks pose seg matting normal pointmap --wait-quiet 60
	$(PY) bench/bench_overhead.py --wait-quiet 60

clean:
	rm -rf $(VENV) out
