"""Memory readings for the app's gauges: NVIDIA GPUs through NVML, torch's CUDA pools, host RSS.

`read_device_memory()` never raises for a missing or failing GPU: NVML errors become a reason
string in the result (`nvml_error`, or a GPU's `error`), so a GUI worker can poll it at a few
hertz. NVML starts once per process and stays up; a failed start is remembered, not retried.
torch is only consulted when something else has already imported it and started CUDA: a
reading must never create a CUDA context of its own.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, TypeVar

_T = TypeVar("_T")
# NVML's (PCI domain, bus, device) of a GPU, the key that matches it to torch's index
PciAddress = tuple[int, int, int]

__all__ = ["DeviceMemory", "GPUMemory", "process_rss", "read_device_memory", "system_memory"]


@dataclass(frozen=True)
class GPUMemory:
    index: int  # NVML's index (PCI order); torch's cuda:N may differ, see torch_device
    name: str
    total_bytes: int | None
    used_bytes: int | None  # by every process on the GPU
    free_bytes: int | None
    process_bytes: int | None  # this process, per NVML; None when NVML does not list it
    torch_device: int | None  # the N of cuda:N when this process's torch has CUDA up
    torch_allocated_bytes: int | None  # tensors torch holds
    torch_reserved_bytes: int | None  # allocated plus torch's cached free blocks
    error: str | None = None  # the NVML reads that failed for this GPU


@dataclass(frozen=True)
class DeviceMemory:
    gpus: tuple[GPUMemory, ...]
    nvml_error: str | None  # why there are no GPU readings; None when NVML answered
    driver_version: str | None
    process_rss_bytes: int | None  # resident memory of this process
    rss_is_peak: bool  # True where only the peak is available (macOS getrusage)
    system_total_bytes: int | None
    system_available_bytes: int | None

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def status(self) -> str:
        """One line for a status bar: the GPUs found, or why there are none."""
        if self.gpus:
            names = ", ".join(dict.fromkeys(g.name for g in self.gpus))
            return f"{len(self.gpus)} NVIDIA GPU{'s' if len(self.gpus) > 1 else ''}: {names}"
        return f"no NVIDIA GPU: {self.nvml_error}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"gpus": [asdict(g) for g in self.gpus]}


def read_device_memory() -> DeviceMemory:
    """A fresh reading of every NVIDIA GPU and of this process's host memory."""
    rss, rss_is_peak = process_rss()
    total, available = system_memory()
    nvml, error, driver = _nvml()
    gpus: tuple[GPUMemory, ...] = ()
    if nvml is not None:
        try:
            torch_devices = _torch_cuda_devices()
            gpus = tuple(
                _read_gpu(nvml, i, torch_devices) for i in range(nvml.nvmlDeviceGetCount())
            )
            if not gpus:
                error = "the NVIDIA driver reports no GPU"
        except nvml.NVMLError as e:
            error = f"NVML could not list the GPUs: {e}"
    return DeviceMemory(gpus, error, driver, rss, rss_is_peak, total, available)


# ---- NVML ------------------------------------------------------------------------------------
_NVML_LOCK = threading.Lock()
_nvml_state: tuple[ModuleType | None, str | None, str | None] | None = None


def _nvml() -> tuple[ModuleType | None, str | None, str | None]:
    """(pynvml or None, why not, driver version), initialised on first use only."""
    global _nvml_state
    with _NVML_LOCK:
        if _nvml_state is None:
            _nvml_state = _start_nvml()
        return _nvml_state


def _start_nvml() -> tuple[ModuleType | None, str | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed", None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        value = getattr(e, "value", None)
        if value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return None, "no NVIDIA driver (NVML library not found)", None
        if value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            return None, "no NVIDIA driver loaded", None
        return None, f"NVML did not start: {e}", None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        driver = None  # only a label; the memory readings do not need it
    return pynvml, None, driver


def _read_gpu(nvml: ModuleType, index: int, torch_devices: dict[PciAddress, int]) -> GPUMemory:
    errors: list[str] = []

    def attempt(what: str, call: Callable[..., _T], *args: object) -> _T | None:
        try:
            return call(*args)
        except nvml.NVMLError as e:
            errors.append(f"{what}: {e}")
            return None

    handle = attempt("handle", nvml.nvmlDeviceGetHandleByIndex, index)
    name = mem = procs = pci = None
    if handle is not None:
        name = attempt("name", nvml.nvmlDeviceGetName, handle)
        mem = attempt("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        procs = attempt("processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        pci = attempt("PCI address", nvml.nvmlDeviceGetPciInfo, handle) if torch_devices else None
    pid = os.getpid()
    mine = [p for p in procs or () if p.pid == pid]
    # usedGpuMemory is None where the driver cannot say (Windows WDDM).
    used_by_me = [p.usedGpuMemory for p in mine if p.usedGpuMemory is not None]
    torch_device = torch_devices.get((pci.domain, pci.bus, pci.device)) if pci else None
    allocated = reserved = None
    if torch_device is not None:
        torch = sys.modules["torch"]
        allocated = torch.cuda.memory_allocated(torch_device)
        reserved = torch.cuda.memory_reserved(torch_device)
    return GPUMemory(
        index=index,
        name=_text(name) if name is not None else f"GPU {index}",
        total_bytes=None if mem is None else int(mem.total),
        used_bytes=None if mem is None else int(mem.used),
        free_bytes=None if mem is None else int(mem.free),
        process_bytes=sum(used_by_me) if used_by_me else None,
        torch_device=torch_device,
        torch_allocated_bytes=allocated,
        torch_reserved_bytes=reserved,
        error="; ".join(errors) or None,
    )


def _torch_cuda_devices() -> dict[PciAddress, int]:
    """(PCI domain, bus, device) -> torch index, for a torch that has already started CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    devices: dict[PciAddress, int] = {}
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        domain = getattr(props, "pci_domain_id", None)
        if domain is not None:
            devices[(domain, props.pci_bus_id, props.pci_device_id)] = i
    return devices


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# ---- host memory -----------------------------------------------------------------------------
def process_rss() -> tuple[int | None, bool]:
    """(resident bytes of this process, whether that figure is the peak rather than now)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/statm", "rb") as f:
                resident_pages = int(f.read().split()[1])
            return resident_pages * os.sysconf("SC_PAGE_SIZE"), False
        except (OSError, ValueError, IndexError):
            pass  # an unusual /proc; getrusage below still gives the peak
    if sys.platform == "win32":
        return _windows_working_set(), False
    try:
        import resource
    except ImportError:
        return None, False
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024, True  # Linux/BSD report KiB


def system_memory() -> tuple[int | None, int | None]:
    """(total, available) physical memory of the machine, None where it cannot be read."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            total = int(fields[b"MemTotal"].split()[0]) * 1024
            available = fields.get(b"MemAvailable")
            return total, None if available is None else int(available.split()[0]) * 1024
        except (OSError, ValueError, KeyError, IndexError):
            return None, None
    if sys.platform == "win32":
        return _windows_memory_status()
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), None
    except (ValueError, OSError, AttributeError):
        return None, None


class _ProcessMemoryCounters(ctypes.Structure):
    _fields_ = [
        ("cb", ctypes.c_uint32),
        ("PageFaultCount", ctypes.c_uint32),
        ("PeakWorkingSetSize", ctypes.c_size_t),
        ("WorkingSetSize", ctypes.c_size_t),
        ("QuotaPeakPagedPoolUsage", ctypes.c_size_t),
        ("QuotaPagedPoolUsage", ctypes.c_size_t),
        ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t),
        ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
        ("PagefileUsage", ctypes.c_size_t),
        ("PeakPagefileUsage", ctypes.c_size_t),
    ]


class _MemoryStatusEx(ctypes.Structure):
    _fields_ = [
        ("dwLength", ctypes.c_uint32),
        ("dwMemoryLoad", ctypes.c_uint32),
        ("ullTotalPhys", ctypes.c_uint64),
        ("ullAvailPhys", ctypes.c_uint64),
        ("ullTotalPageFile", ctypes.c_uint64),
        ("ullAvailPageFile", ctypes.c_uint64),
        ("ullTotalVirtual", ctypes.c_uint64),
        ("ullAvailVirtual", ctypes.c_uint64),
        ("ullAvailExtendedVirtual", ctypes.c_uint64),
    ]


def _windows_working_set() -> int | None:
    if sys.platform != "win32":  # callers check first; this tells mypy ctypes.WinDLL exists
        return None
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.GetCurrentProcess.restype = ctypes.c_void_p
    get_info = kernel32.K32GetProcessMemoryInfo  # psapi's GetProcessMemoryInfo, in kernel32
    get_info.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(_ProcessMemoryCounters),
        ctypes.c_uint32,
    ]
    get_info.restype = ctypes.c_int
    counters = _ProcessMemoryCounters()
    counters.cb = ctypes.sizeof(counters)
    if not get_info(kernel32.GetCurrentProcess(), ctypes.byref(counters), counters.cb):
        return None
    return int(counters.WorkingSetSize)


def _windows_memory_status() -> tuple[int | None, int | None]:
    if sys.platform != "win32":  # callers check first; this tells mypy ctypes.WinDLL exists
        return None, None
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    status = _MemoryStatusEx()
    status.dwLength = ctypes.sizeof(status)
    if not kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        return None, None
    return int(status.ullTotalPhys), int(status.ullAvailPhys)
