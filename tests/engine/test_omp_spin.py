"""OpenMP's idle spinning bounded before torch loads its runtime (engine/omp_spin.py): set
unless the user chose, and set before the first `import torch` of `import engine` or `import
app`, where the runtime reads it."""

import subprocess
import sys

from kvscope.engine.omp_spin import SPIN_ROUNDS, bound_openmp_spin


def test_the_limit_is_set_unless_the_user_chose_one():
    env: dict[str, str] = {}
    assert bound_openmp_spin(env) and env == {"GOMP_SPINCOUNT": SPIN_ROUNDS}
    for own in ({"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": "PASSIVE"}):
        env = dict(own)
        assert not bound_openmp_spin(env) and env == own


ORDER = """
import builtins, os, sys
seen = []
real = builtins.__import__
def spy(name, *args, **kwargs):
    if name == "torch" and "torch" not in sys.modules:
        seen.append(("torch", os.environ.get("GOMP_SPINCOUNT")))
    return real(name, *args, **kwargs)
builtins.__import__ = spy
import {package}
print(seen[0])
"""


def test_torch_first_loads_with_the_limit_in_the_environment():
    env = {k: v for k, v in __import__("os").environ.items() if k != "GOMP_SPINCOUNT"}
    for package in ("kvscope.engine", "kvscope.app.cli.main"):
        out = subprocess.run(
            [sys.executable, "-c", ORDER.format(package=package)],
            capture_output=True, text=True, env=env, timeout=120, check=True,
        )  # fmt: skip
        assert out.stdout.strip() == repr(("torch", SPIN_ROUNDS)), (package, out.stdout)
