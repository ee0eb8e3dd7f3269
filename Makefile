# fastops developer commands. Each target uses the active virtualenv when one is active
# ($VIRTUAL_ENV), otherwise creates ./.venv with the pinned CPU torch and the dev requirements.
#   make test        build fastops (editable) and run the test suite
#   make test-avx2   the CPU op tests again as an AVX2-only x86-64 CPU runs them (AVX2 level forced, ATen and oneDNN capped)
#   make test-default the CPU op tests again at the DEFAULT level (no AVX: as an old x86-64 or an aarch64 CPU runs them)
#   make cross-aarch64 compile csrc/ (DEFAULT level) for aarch64 with Debian's cross compiler, against this torch's headers
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

# The best ISA level of the CPU kernels this CPU runs (fastops/_build.py; it imports no torch).
BEST_CPU_CAPABILITY := $(shell $(PYTHON) -c "import runpy; b = runpy.run_path('fastops/_build.py'); \
	print(b['best_cpu_capability'](list(b['CPU_CAPABILITIES'])))")

ifdef VIRTUAL_ENV
PY := $(VIRTUAL_ENV)/bin/python
ENV_STAMP :=
else
PY := .venv/bin/python
ENV_STAMP := .venv/.installed
endif

.PHONY: .FORCE env install test test-avx2 test-default cross-aarch64 bench demo lint format cuda-check test-models upgrade-check clean

.venv/.installed: requirements-dev.txt
	$(PYTHON) -m venv .venv
	.venv/bin/python -m pip install -q $(TORCH_SPEC) -r requirements-dev.txt
	touch $@

env: $(ENV_STAMP)

# `pip install -e .` compiles in a fresh temporary directory, so each run rebuilds everything (three ISA
# levels: ~9 min on 2 cores). It runs again only when what it builds from changed, the library is gone,
# or the environment or the build settings differ (the stamp's name).
BUILD_INPUTS := $(shell find csrc -type f) setup.py pyproject.toml fastops/_build.py
INSTALL_STAMP := build/.installed-$(shell echo "$(abspath $(PY)) $(FASTOPS_CPU_CAPABILITIES) $(FASTOPS_CUDA)" | cksum | cut -d' ' -f1)
install: $(INSTALL_STAMP)
$(INSTALL_STAMP): $(ENV_STAMP) $(BUILD_INPUTS) $(if $(wildcard fastops/_C*.so),,.FORCE)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@mkdir -p build && touch $@
.FORCE:

test: install
	$(PY) -m pytest tests -q

# tests/ops at one ISA level of fastops' CPU kernels, as a CPU whose best level that is runs them, so an
# AVX-512 machine sees what it would see: the same library with the level forced at run time
# (FASTOPS_CPU_CAPABILITY), ATen's kernels of that level, and oneDNN capped to match (which moves eager
# bf16 convs, the tests' yardstick, off oneDNN's AVX-512 paths). Inductor gets a cache of its own: its
# FX-graph cache is not keyed on the ATen capability, and an AVX-512 entry reused under
# ATEN_CPU_CAPABILITY=avx2 fails. The first command checks that all of it took effect.
#   $(call test_level,<fastops level>,<ATen's name of it>,<oneDNN ISA cap>,<CPU flag the level needs>)
define test_level
	@if [ -n "$(4)" ] && ! grep -qw $(4) /proc/cpuinfo 2>/dev/null; then echo "test-$(1): no $(4) on this CPU, skipped"; exit 0; fi; \
	set -e; level_env="FASTOPS_CPU_CAPABILITY=$(1) ATEN_CPU_CAPABILITY=$(1) ONEDNN_MAX_CPU_ISA=$(3) \
	  TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/build/torchinductor-$(1)"; \
	env $$level_env $(PY) -c "import torch, fastops._extension as ext; \
	  got = (torch.backends.cpu.get_cpu_capability(), ext.load().cpu_capability, torch.ops.mkldnn._is_mkldnn_bf16_supported()); \
	  print('test-$(1): ATen %s, fastops %s, oneDNN bf16 %s' % got); assert got == ('$(2)', '$(1)', False), got"; \
	env $$level_env $(PY) -m pytest tests/ops -q
endef

test-avx2: install
	$(call test_level,avx2,AVX2,AVX2,avx2)

test-default: install
	$(call test_level,default,DEFAULT,SSE41,)

# csrc/ compiled (not linked) for aarch64 at the DEFAULT level, against the installed torch's headers:
# proves that no x86 flag or intrinsic leaks into the code every CPU runs. Needs g++-aarch64-linux-gnu.
cross-aarch64: env
	$(PY) .ci/cross_compile.py --target aarch64-linux-gnu

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
# resolves every symbol of the library), then runs a CPU op through it. One ISA level of the CPU
# kernels (DEFAULT) is enough to link them: the others are `make test`'s build.
cuda-check: .venv-cuda/.installed
	@set -euo pipefail; tmp=$$(mktemp -d); \
	git ls-files -z -c -o --exclude-standard | xargs -0 cp --parents -t $$tmp; \
	cd $$tmp && FASTOPS_CUDA=1 FASTOPS_CPU_CAPABILITIES=default TORCH_CUDA_ARCH_LIST="$(CUDA_ARCH)" CUDA_HOME=$${CUDA_HOME:-/usr/local/cuda} \
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
# from the main env's build (the JIT cache is keyed on the torch version), at the DEFAULT level and
# the CPU's best only (FASTOPS_CPU_CAPABILITIES): the other levels are the op tests' business.
MODELS_ENV = FASTOPS_JIT=1 FASTOPS_CUDA=0 FASTOPS_CPU_CAPABILITIES=$(BEST_CPU_CAPABILITY) PYTHONPATH=$(CURDIR)
test-models: .venv-cuda/.models-installed
	$(MODELS_ENV) .venv-cuda/bin/python -m pytest tests/models -q
	$(MODELS_ENV) .venv-cuda/bin/python -m pytest tests/train/test_cli.py -q -k image_folder

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
