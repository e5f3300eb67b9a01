# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# second environment: TransformerLens 4.3, the full suite (docs/tl4.md)
VENV_TL4 ?= .venv-tl4
PY_TL4 := $(VENV_TL4)/bin/python
STAMP_TL4 := $(VENV_TL4)/.installed

.PHONY: demo test test-fast test-tl4 test-tl4-fast test-foreign-cpu test-pip docs bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch (on this project's machines it is served from local disk)
	$(PY) -m pip install -q torch==2.13.0
	# the TransformerLens 3.9 line here (the HookedTransformer subclass); make test-tl4 runs the 4.3 line
	$(PY) -m pip install -q -e '.[dev]' 'transformer-lens>=3.9,<4'
	# auto-circuit, the peer tests/library/analysis/test_edges_auto_circuit.py checks the edge scores against:
	# without its declared dependencies (tracr, word2word, a tqdm fork are not used by its edge attribution), with
	# the three it imports
	$(PY) -m pip install -q --no-deps 'auto-circuit==1.0.1'
	$(PY) -m pip install -q 'attrs>=23' 'ordered-set>=4.1' 'blobfile>=2.0.2'
	touch $(STAMP)

$(STAMP_TL4): pyproject.toml requirements-tl4.txt
	python3 -m venv $(VENV_TL4)
	$(PY_TL4) -m pip install -q --upgrade pip
	$(PY_TL4) -m pip install -q torch==2.13.0
	$(PY_TL4) -m pip install -q -r requirements-tl4.txt 'transformer-lens==4.3.0' -e '.[dev]'
	touch $(STAMP_TL4)

demo: $(STAMP)
	$(VENV)/bin/circuitfade demo

# the whole suite, one pytest worker per core up to 4 (pytest-xdist)
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup

# the whole suite under TransformerLens 4.3
test-tl4: $(STAMP_TL4)
	$(PY_TL4) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup

# what CI runs under TransformerLens 4.3: the tests not marked slow, then every line test (tests/tl4/, slow ones
# too) and every user-facing page and tutorial (the README and docs blocks, the notebooks)
test-tl4-fast: $(STAMP_TL4)
	$(PY_TL4) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup -m "not slow"
	$(PY_TL4) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup \
	  tests/tl4 tests/docs/test_readme.py tests/docs/test_tutorials.py

# the suite on emulated foreign CPUs: torch's kernels without AVX (default) and with AVX2 only, MKL on its
# compatible / AVX2 code paths. Every test not marked slow, and the slow ones marked numerics (fixtures from
# another machine or line, trained runs, bit-identity within one machine); tests/tolerances.py says by how much
# a number may differ from a file written elsewhere.
FOREIGN_CPUS ?= default:COMPATIBLE avx2:AVX2
test-foreign-cpu: $(STAMP)
	@set -e; for cpu in $(FOREIGN_CPUS); do \
	  echo "== ATEN_CPU_CAPABILITY=$${cpu%%:*} MKL_CBWR=$${cpu##*:}"; \
	  ATEN_CPU_CAPABILITY=$${cpu%%:*} MKL_CBWR=$${cpu##*:} $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup -m "numerics or not slow"; \
	done

# a pip user's first hour: non-editable install in a fresh venv, README block + tutorials 01-02 from another folder
test-pip:
	bash .ci/pip_user.sh

test-fast: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup -m "not slow"

STAMP_DOCS := $(VENV)/.docs-installed
$(STAMP_DOCS): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]' 'transformer-lens>=3.9,<4'
	touch $(STAMP_DOCS)

# the docs site: every page, link, anchor, included results file and docstring checked
docs: $(STAMP_DOCS)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

bench: $(STAMP)
	$(PY) benchmarks/train_step.py

clean:
	rm -rf $(VENV) $(VENV_TL4) runs site
