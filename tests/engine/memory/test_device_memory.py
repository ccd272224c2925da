"""Device memory readings: no driver here, host RSS, and the GPU path against a fake pynvml."""

import json
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from kvscope.engine.memory import device_memory
from kvscope.engine.memory.device_memory import read_device_memory

MiB = 1 << 20


@pytest.fixture(autouse=True)
def fresh_nvml(monkeypatch):
    """Each test starts NVML afresh; monkeypatch puts the module's cached state back after."""
    monkeypatch.setattr(device_memory, "_nvml_state", None)


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {15: "GPU is lost", 3: "Not Supported"}.get(self.value, f"code {self.value}")


def fake_pynvml(monkeypatch, *, fail: dict | None = None) -> types.ModuleType:
    """Two GPUs; this process uses 300 MiB of GPU 0. `fail` maps (function, gpu) -> error code."""
    fail = fail or {}
    gpus = [
        dict(name=b"NVIDIA H100 80GB HBM3", total=80 * 1024 * MiB, used=20_000 * MiB, bus=0x41),
        dict(name="NVIDIA L4", total=24 * 1024 * MiB, used=1_000 * MiB, bus=0x81),
    ]
    procs = {
        0: [
            SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=19_000 * MiB),
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=300 * MiB),
        ],
        1: [SimpleNamespace(pid=os.getpid() + 2, usedGpuMemory=None)],
    }
    nvml = types.ModuleType("pynvml")
    nvml.init_calls = 0

    def failing(fn_name, fn):
        def call(arg=None):
            code = fail.get((fn_name, arg))
            if code is not None:
                raise FakeNVMLError(code)
            return fn(arg)

        return call

    def init(_=None):
        nvml.init_calls += 1

    def memory(i):
        g = gpus[i]
        return SimpleNamespace(total=g["total"], used=g["used"], free=g["total"] - g["used"])

    funcs = {
        "nvmlInit": init,
        "nvmlSystemGetDriverVersion": lambda _: "550.54.15",
        "nvmlDeviceGetCount": lambda _: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda i: gpus[i]["name"],
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetComputeRunningProcesses": lambda i: procs[i],
        "nvmlDeviceGetPciInfo": lambda i: SimpleNamespace(domain=0, bus=gpus[i]["bus"], device=0),
    }
    for name, fn in funcs.items():
        setattr(nvml, name, failing(name, fn))
    nvml.NVMLError = FakeNVMLError
    nvml.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    nvml.NVML_ERROR_DRIVER_NOT_LOADED = 9
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_no_driver_is_a_state_not_an_exception():
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    reading = read_device_memory()
    assert reading.gpus == () and not reading.has_gpu
    assert reading.nvml_error == "no NVIDIA driver (NVML library not found)"
    assert reading.status == "no NVIDIA GPU: no NVIDIA driver (NVML library not found)"
    json.dumps(reading.to_dict())


def test_process_rss_is_plausible():
    reading = read_device_memory()
    # Touched, so resident. Only compared with the kernel's own figure below: earlier tests in
    # the same process may leave freed pages that the allocator reuses, so RSS need not grow.
    big = torch.ones(64 * MiB // 4)
    after = read_device_memory()
    assert 10 * MiB < reading.process_rss_bytes < reading.system_total_bytes
    assert after.process_rss_bytes > 64 * MiB
    if sys.platform.startswith("linux"):
        status = open("/proc/self/status").read()
        vm_rss = int(status.split("VmRSS:")[1].split()[0]) * 1024
        assert abs(vm_rss - after.process_rss_bytes) < 16 * MiB
        assert not after.rss_is_peak
    assert 0 < after.system_available_bytes <= after.system_total_bytes
    del big


def test_gpu_readings_from_nvml(monkeypatch):
    nvml = fake_pynvml(monkeypatch)
    reading = read_device_memory()
    read_device_memory()
    assert nvml.init_calls == 1  # started once, then cached
    assert reading.nvml_error is None and reading.driver_version == "550.54.15"
    h100, l4 = reading.gpus
    assert h100.name == "NVIDIA H100 80GB HBM3" and l4.name == "NVIDIA L4"
    assert h100.total_bytes == 80 * 1024 * MiB and h100.used_bytes == 20_000 * MiB
    assert h100.free_bytes == h100.total_bytes - h100.used_bytes
    assert h100.process_bytes == 300 * MiB  # only this process's entry
    assert l4.process_bytes is None  # not listed on that GPU
    assert h100.torch_device is None  # torch has not started CUDA here
    assert h100.error is None and l4.error is None
    assert reading.status == "2 NVIDIA GPUs: NVIDIA H100 80GB HBM3, NVIDIA L4"
    assert json.loads(json.dumps(reading.to_dict()))["gpus"][1]["total_bytes"] == 24 * 1024 * MiB


def test_torch_figures_follow_the_pci_address(monkeypatch):
    fake_pynvml(monkeypatch)
    # torch sees only the L4 (as cuda:0), as with CUDA_VISIBLE_DEVICES=1.
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x81, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 100 * MiB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 128 * MiB)
    h100, l4 = read_device_memory().gpus
    assert h100.torch_device is None and h100.torch_allocated_bytes is None
    assert l4.torch_device == 0
    assert (l4.torch_allocated_bytes, l4.torch_reserved_bytes) == (100 * MiB, 128 * MiB)


def test_an_nvml_error_mid_read_spoils_only_that_figure(monkeypatch):
    fake_pynvml(
        monkeypatch,
        fail={("nvmlDeviceGetMemoryInfo", 1): 15, ("nvmlDeviceGetComputeRunningProcesses", 0): 3},
    )
    h100, l4 = read_device_memory().gpus
    assert h100.total_bytes == 80 * 1024 * MiB and h100.process_bytes is None
    assert h100.error == "processes: Not Supported"
    assert l4.name == "NVIDIA L4" and l4.total_bytes is None and l4.free_bytes is None
    assert l4.error == "memory: GPU is lost"


def test_an_nvml_error_listing_gpus_is_reported(monkeypatch):
    fake_pynvml(monkeypatch, fail={("nvmlDeviceGetCount", None): 15})
    reading = read_device_memory()
    assert reading.gpus == ()
    assert reading.nvml_error == "NVML could not list the GPUs: GPU is lost"
    assert reading.process_rss_bytes > 0


@pytest.mark.parametrize(
    ("code", "message"),
    [(9, "no NVIDIA driver loaded"), (15, "NVML did not start: GPU is lost")],
)
def test_init_failures_are_remembered(monkeypatch, code, message):
    nvml = fake_pynvml(monkeypatch, fail={("nvmlInit", None): code})
    assert read_device_memory().nvml_error == message
    assert read_device_memory().nvml_error == message
    assert nvml.init_calls == 0


def test_missing_pynvml_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    reading = read_device_memory()
    assert reading.gpus == () and "nvidia-ml-py" in reading.nvml_error
