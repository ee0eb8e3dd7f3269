# fastops developer commands. Each target uses the active virtualenv when one is active
# ($VIRTUAL_ENV), otherwise creates ./.venv with the pinned CPU torch and the dev requirements.
#   make test        build fastops (editable) and run the test suite
#   make test-avx2   the CPU op tests again as an AVX2-only x86-64 CPU runs them (AVX2 build, ATen and oneDNN capped)
#   make bench       run every benchmarks/bench_*.py on this machine, a CSV per run into benchmarks/results/data/
#   make demo        the main job: fastops vs stock PyTorch on sklearn's digits (table + runs/demo/compare.png)
#   make lint        ruff, clang-format, mypy
#   make cuda-check  build + link the CUDA kernels against a CUDA 13 torch (no GPU needed)
#   make test-models swap_modules on real timm / torchvision models (in .venv-cuda, on the CPU)
#   make upgrade-check the library built for the main env's torch, imported under .venv-cuda's newer torch
SHELL := /bin/bash
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
CUDA_TORCH_SPEC ?= torch==2.14.1
CUDA_ARCH ?= 9.0

ifdef VIRTUAL_ENV
PY := $(VIRTUAL_ENV)/bin/python
ENV_STAMP :=
else
PY := .venv/bin/python
ENV_STAMP := .venv/.installed
endif

.PHONY: env install test test-avx2 bench demo lint format cuda-check test-models upgrade-check clean

.venv/.installed: requirements-dev.txt
	$(PYTHON) -m venv .venv
	.venv/bin/python -m pip install -q $(TORCH_SPEC) -r requirements-dev.txt
	touch $@

env: $(ENV_STAMP)

install: env
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .

test: install
	$(PY) -m pytest tests -q

# tests/ops as an x86-64 CPU without AVX-512 runs them, so an AVX-512 machine sees what it would see:
# fastops' AVX2 build (JIT, cached apart from the default build), ATen's AVX2 kernels, and oneDNN
# capped at AVX2 (which moves eager bf16 convs, the tests' yardstick, off oneDNN). Inductor gets a
# cache of its own: its FX-graph cache is not keyed on the ATen capability, and an AVX-512 entry
# reused under ATEN_CPU_CAPABILITY=avx2 fails. The first command checks that all of it took effect.
AVX2_ENV := FASTOPS_JIT=1 FASTOPS_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/build/torchinductor-avx2 PYTHONPATH=$(CURDIR)

test-avx2: env
	@if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then echo "test-avx2: no AVX2 on this CPU, skipped"; exit 0; fi; \
	set -e; \
	$(AVX2_ENV) $(PY) -c "import torch, fastops._extension as ext; \
	  got = (torch.backends.cpu.get_cpu_capability(), ext.load().cpu_capability, torch.ops.mkldnn._is_mkldnn_bf16_supported()); \
	  print('test-avx2: ATen %s, fastops %s, oneDNN bf16 %s' % got); assert got == ('AVX2', 'avx2', False), got"; \
	$(AVX2_ENV) $(PY) -m pytest tests/ops -q

# Every benchmarks/bench_*.py, no hand-kept list: a new op's benchmark runs as soon as it exists.
bench: install
	@set -e; for bench in benchmarks/bench_*.py; do \
	  echo "== $$bench"; $(PY) -m benchmarks.$$(basename $$bench .py); \
	done

demo: install
	$(PY) -m fastops.train --compare --out-dir runs/demo

lint: env
	$(PY) -m ruff check fastops tests benchmarks setup.py
	$(PY) -m ruff format --check fastops tests benchmarks setup.py
	find csrc -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' | xargs $(dir $(PY))clang-format --dry-run -Werror
	$(PY) -m mypy

format: env
	$(PY) -m ruff check --fix fastops tests benchmarks setup.py
	$(PY) -m ruff format fastops tests benchmarks setup.py
	find csrc -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' | xargs $(dir $(PY))clang-format -i

.venv-cuda/.installed:
	$(PYTHON) -m venv .venv-cuda
	.venv-cuda/bin/python -m pip install -q $(CUDA_TORCH_SPEC) numpy ninja "setuptools>=64" wheel
	touch $@

# Builds a wheel with the CUDA kernels from a copy of the tree, installs it and imports it (which
# resolves every symbol of the library), then runs a CPU op through it.
cuda-check: .venv-cuda/.installed
	@set -euo pipefail; tmp=$$(mktemp -d); \
	git ls-files -z -c -o --exclude-standard | xargs -0 cp --parents -t $$tmp; \
	cd $$tmp && FASTOPS_CUDA=1 TORCH_CUDA_ARCH_LIST="$(CUDA_ARCH)" CUDA_HOME=$${CUDA_HOME:-/usr/local/cuda} \
	  $(CURDIR)/.venv-cuda/bin/python -m pip wheel -q --no-build-isolation --no-deps -w dist . ; \
	$(CURDIR)/.venv-cuda/bin/python -m pip install -q --no-deps --force-reinstall --target $$tmp/site dist/*.whl; \
	cd /tmp && PYTHONPATH=$$tmp/site $(CURDIR)/.venv-cuda/bin/python -m fastops.info | tee $$tmp/info.txt; \
	grep -q "CUDA kernels: compiled in" $$tmp/info.txt; \
	PYTHONPATH=$$tmp/site $(CURDIR)/.venv-cuda/bin/python -c "import torch, fastops; \
	  x = torch.rand(1000) + 0.1; torch.testing.assert_close(fastops.clipped_log(x), torch.log(x)); \
	  print('cuda-check: CUDA build of fastops imports and runs')"; \
	rm -rf $$tmp

.venv-cuda/.models-installed: .venv-cuda/.installed requirements-models.txt
	.venv-cuda/bin/python -m pip install -q --no-deps $$(grep -E '^torchvision==' requirements-models.txt)
	.venv-cuda/bin/python -m pip install -q -r requirements-models.txt
	touch $@

# tests/models, and the CLI's ImageFolder runs of torchvision:/timm: models, need a torchvision built
# for the installed torch: there is none for the CPU torch of the main env, so they run in .venv-cuda
# (torch 2.14.1 + cu130, on the CPU). FASTOPS_CUDA=0 JIT-builds the CPU kernels only, cached apart
# from the main env's build (the JIT cache is keyed on the torch version).
test-models: .venv-cuda/.models-installed
	FASTOPS_JIT=1 FASTOPS_CUDA=0 PYTHONPATH=$(CURDIR) .venv-cuda/bin/python -m pytest tests/models -q
	FASTOPS_JIT=1 FASTOPS_CUDA=0 PYTHONPATH=$(CURDIR) .venv-cuda/bin/python -m pytest tests/train/test_cli.py -q -k image_folder

# What `pip install -U torch` does to an installed fastops: the library built in the main env imported
# under .venv-cuda's torch (another version), from a copy of the package without csrc/ as a wheel
# installs it. The import must refuse it before loading it, naming both torches and the rebuild command
# (not the dynamic linker's "undefined symbol"). No compiling: it reuses `make install`'s library.
upgrade-check: install .venv-cuda/.installed
	@set -euo pipefail; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; cp -r fastops $$tmp/; \
	built=$$($(PY) -c "import torch; print(torch.__version__)"); \
	running=$$(.venv-cuda/bin/python -c "import torch; print(torch.__version__)"); \
	if [ "$$built" = "$$running" ]; then echo "upgrade-check: both envs run torch $$built, nothing to check"; exit 0; fi; \
	if (cd $$tmp && $(CURDIR)/.venv-cuda/bin/python -c "import fastops") 2> $$tmp/err.txt; then \
	  echo "upgrade-check: the library built for torch $$built imported under torch $$running"; exit 1; fi; \
	if ! grep -qF "compiled against torch $$built" $$tmp/err.txt || ! grep -qF "but torch $$running" $$tmp/err.txt || \
	   ! grep -qF "pip install --no-build-isolation --force-reinstall --no-deps" $$tmp/err.txt; then \
	  tail -5 $$tmp/err.txt; echo "upgrade-check: not the expected error"; exit 1; fi; \
	tail -3 $$tmp/err.txt; echo "upgrade-check: a build for torch $$built is refused by name under torch $$running"

clean:
	rm -rf build dist *.egg-info fastops/_C*.so fastops/_compiled.json
