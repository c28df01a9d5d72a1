# The two set-up commands: `make demo` and `make test`. Both work offline on a fresh clone
# (package registries only: PyPI and npm).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JS := clients/js
JS_STAMP := $(JS)/node_modules/.installed

.PHONY: demo test test-python test-js install bench vectors clean

# uv fetches and unpacks the 4 GB of the CUDA torch build and its nvidia-* wheels in parallel, and
# byte-compiles on every core: about 1 minute where pip took 1.5 to 4.5 (its downloads one by one).
# The same pins (constraints.txt); if uv cannot run here, pip installs the same set.
PACKAGES := torch torchvision -e './clients/python[test,images]' -e '.[test,cluster]'
# Said before the install starts (README "Installing"): what comes, how big, how long, and that it is quiet.
INSTALL_NOTE := installing the Python packages into $(VENV), once: PyTorch (PyPI's Linux build, made for CUDA: \
  it runs on a CPU too) with its nvidia-* and triton libraries, torchvision, Ultralytics, OpenCV, PyAV, Ray, \
  transformers (the tests' reference) and this project. About 4 GB to download and 7 GB on disk (5 of them \
  PyTorch's CUDA libraries); 1 to 5 minutes, quiet until it is done.

$(STAMP): pyproject.toml clients/python/pyproject.toml constraints.txt
	@echo "make: $(INSTALL_NOTE)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv==0.13.9
	UV_NATIVE_TLS=1 $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt $(PACKAGES) \
	  || { echo "uv failed: installing with pip"; $(PY) -m pip install -q -c constraints.txt $(PACKAGES); }
	touch $(STAMP)
	@echo "make: $(VENV) is ready ($$(du -sh $(VENV) | cut -f1))"

$(JS_STAMP): $(JS)/package.json $(JS)/package-lock.json
	@echo "make: installing the JavaScript client's packages into $(JS)/node_modules (zeromq, msgpack, esbuild: 50 MB)"
	cd $(JS) && npm ci --no-audit --no-fund --loglevel=error
	touch $(JS_STAMP)

install: $(STAMP) $(JS_STAMP)

# pytest exits 5 when it collects no tests: that is not a failure of the code.
test: test-python test-js

# Two workers: most tests wait on subprocesses with one torch thread. --dist loadgroup (tests/conftest.py
# schedules it): a file's tests run in one worker (its module fixtures, such as the fleet's Ray cluster,
# made once), except the files it spreads test by test; the slow ones start first.
TEST_WORKERS ?= 2

test-python: $(STAMP)
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup tests clients/python/tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-js: $(STAMP) $(JS_STAMP)
	cd $(JS) && SAPIENS2_STREAM_CLI=$(CURDIR)/$(VENV)/bin/sapiens2-stream SAPIENS2_STREAM_PYTHON=$(CURDIR)/$(PY) npm test

demo: $(STAMP)
	@echo "make: the main job on the demo clip (180 frames, 1280x720) -> out/demo.mp4 + out/demo.jsonl; minutes on a CPU, Ctrl-C stops it with the outputs so far finished"
	$(VENV)/bin/sapiens2-stream --config configs/demo.yaml

# The JavaScript client's browser build, after a change of clients/js/src (commit the result: the
# viewer serves pipeline/viewer/static/sapiens2-client.browser.js; clients/js/test/bundle.test.js checks it).
.PHONY: bundle
bundle: $(JS_STAMP)
	cd $(JS) && npm run build

# The shared wire test vectors, after a change of the wire format (commit the result).
vectors: $(STAMP)
	$(PY) clients/vectors/make_vectors.py

# CPU figures of docs/PERFORMANCE.md (minutes; run on an otherwise idle machine).
bench: $(STAMP)
	$(PY) -m bench.bench_pose_cpu --wait-quiet 60
	$(PY) -m bench.bench_stages --config medium --tasks pose seg matting normal pointmap --wait-quiet 60
	$(PY) -m bench.bench_overhead --wait-quiet 60

clean:
	rm -rf $(VENV) out $(JS)/node_modules
