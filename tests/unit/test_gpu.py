"""gate.gpu: NVML readings, every failure mapped to a short reason, never a crash.

The real path runs on this machine (no GPU, no NVML library); every other error
is simulated at the boundary by a fake nvml module that raises pynvml's real
exception classes (``pynvml.NVMLError(code)`` builds the matching subclass
without the library).
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pynvml
import pytest

from gate.observe.gpu import GIB, INIT_RETRY_S, GpuDevice, GpuMonitor, GpuProcess, GpuReading, format_reading

_CONSTANTS = {name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith("NVML_ERROR_")}


def nvml_error(code_name: str) -> pynvml.NVMLError:
    return pynvml.NVMLError(getattr(pynvml, code_name))


class FakeNvml:
    """A stand-in for the pynvml module: same function names, same exceptions, no library.

    ``devices``: list of dicts (name, used, total, reserved, util, procs).
    ``fail``: function name -> NVML_ERROR_* name (raised on every call) .
    ``init_fail``: list of error names raised by successive nvmlInit calls.
    """

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, devices=(), *, fail=None, init_fail=(), memory_v2=True, block=None):
        for name, value in _CONSTANTS.items():
            setattr(self, name, value)
        self.devices = list(devices)
        self.fail = dict(fail or {})
        self.init_fail = list(init_fail)
        self.memory_v2 = memory_v2
        self.block = block  # threading.Event: nvmlDeviceGetCount waits on it
        self.entered = threading.Event()  # set when a call has reached the block
        self.calls: list[str] = []
        self.init_count = self.shutdown_count = 0

    def _call(self, fn: str) -> None:
        self.calls.append(fn)
        if fn in self.fail:
            raise nvml_error(self.fail[fn])

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        self.init_count += 1
        if self.init_fail:
            raise nvml_error(self.init_fail.pop(0))

    def nvmlShutdown(self):
        self.calls.append("nvmlShutdown")
        self.shutdown_count += 1

    def nvmlDeviceGetCount(self):
        if self.block is not None:
            self.entered.set()
            self.block.wait()
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._call("nvmlDeviceGetHandleByIndex")
        return self.devices[i]

    def nvmlDeviceGetName(self, h):
        self._call("nvmlDeviceGetName")
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version is not None:
            self.calls.append("nvmlDeviceGetMemoryInfo_v2")
            if not self.memory_v2:
                raise nvml_error("NVML_ERROR_FUNCTION_NOT_FOUND")
            self._call("nvmlDeviceGetMemoryInfo")
            return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"] - h["reserved"], reserved=h["reserved"])
        self._call("nvmlDeviceGetMemoryInfo")
        used = h["used"] + h["reserved"]  # v1 counts the reserved memory as used
        return SimpleNamespace(total=h["total"], used=used, free=h["total"] - used)

    def nvmlDeviceGetUtilizationRates(self, h):
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in h["procs"]]


H200 = dict(
    name="NVIDIA H200",
    used=int(61.2 * GIB),
    total=int(139.8 * GIB),
    reserved=512 * 2**20,
    util=44,
    procs=[(4242, int(60 * GIB)), (77, None)],
)
L4 = dict(name=b"NVIDIA L4", used=2 * GIB, total=int(22.5 * GIB), reserved=256 * 2**20, util=0, procs=[])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the real path on this machine ------------------------------------------


def test_real_nvml_without_library_reports_library_not_found():
    monitor = GpuMonitor()
    reading = monitor.read()
    assert reading == GpuReading(devices=(), unavailable="NVML library not found")
    assert format_reading(reading) == ["n/a: NVML library not found"]
    monitor.close()  # never initialised: nothing to shut down, no error


async def test_real_nvml_read_async_reports_library_not_found():
    reading = await GpuMonitor().read_async()
    assert reading.unavailable == "NVML library not found"


# --- readings from a fake with two devices ------------------------------------


def test_two_devices_are_read_with_memory_v2_utilisation_and_processes():
    fake = FakeNvml([H200, L4])
    reading = GpuMonitor(fake).read()
    assert reading.unavailable is None
    assert reading.devices == (
        GpuDevice(
            0, "NVIDIA H200", H200["used"], H200["total"], H200["reserved"], 44, (GpuProcess(4242, int(60 * GIB)), GpuProcess(77, None))
        ),
        GpuDevice(1, "NVIDIA L4", 2 * GIB, L4["total"], L4["reserved"], 0, ()),
    )
    assert format_reading(reading) == [
        "GPU0 NVIDIA H200  61.2/139.8 GiB  44%",
        "GPU1 NVIDIA L4  2.0/22.5 GiB  0%",
    ]
    assert format_reading(reading, {4242: "llama-server", 1: "other"}) == [
        "GPU0 NVIDIA H200  61.2/139.8 GiB  44%",
        "  llama-server (pid 4242)  60.0 GiB",
        "GPU1 NVIDIA L4  2.0/22.5 GiB  0%",
    ]


def test_nvml_is_initialised_once_and_shut_down_once():
    fake = FakeNvml([L4])
    monitor = GpuMonitor(fake)
    monitor.read()
    monitor.read()
    assert fake.init_count == 1
    monitor.close()
    monitor.close()
    assert fake.shutdown_count == 1


def test_driver_without_memory_v2_falls_back_to_v1_without_reserved():
    fake = FakeNvml([H200], memory_v2=False)
    monitor = GpuMonitor(fake)
    (dev,) = monitor.read().devices
    assert dev.reserved_bytes is None
    assert dev.used_bytes == H200["used"] + H200["reserved"]
    assert dev.total_bytes == H200["total"]
    monitor.read()
    assert fake.calls.count("nvmlDeviceGetMemoryInfo_v2") == 1  # not retried on every read


def test_module_without_memory_v2_constant_uses_v1():
    fake = FakeNvml([L4])
    fake.nvmlMemory_v2 = None
    (dev,) = GpuMonitor(fake).read().devices
    assert dev.reserved_bytes is None
    assert "nvmlDeviceGetMemoryInfo_v2" not in fake.calls


def test_no_devices_is_a_reason_not_an_empty_panel():
    assert GpuMonitor(FakeNvml([])).read() == GpuReading((), "no NVIDIA GPU found")


# --- fields that are not supported --------------------------------------------


def test_utilisation_not_supported_is_none_but_memory_is_present():
    fake = FakeNvml([H200], fail={"nvmlDeviceGetUtilizationRates": "NVML_ERROR_NOT_SUPPORTED"})
    reading = GpuMonitor(fake).read()
    assert reading.unavailable is None
    (dev,) = reading.devices
    assert dev.utilization_pct is None
    assert (dev.used_bytes, dev.total_bytes) == (H200["used"], H200["total"])
    assert format_reading(reading) == ["GPU0 NVIDIA H200  61.2/139.8 GiB  n/a"]


@pytest.mark.parametrize("code", ["NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION"])
def test_processes_not_available_leave_an_empty_list(code):
    fake = FakeNvml([H200], fail={"nvmlDeviceGetComputeRunningProcesses": code})
    (dev,) = GpuMonitor(fake).read().devices
    assert dev.processes == ()
    assert dev.utilization_pct == 44


# --- every error class maps to a short reason ----------------------------------

INIT_ERRORS = [
    ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML library not found"),
    ("NVML_ERROR_DRIVER_NOT_LOADED", "NVIDIA driver not loaded"),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", "driver/library version mismatch (reboot after driver upgrade?)"),
    ("NVML_ERROR_NO_PERMISSION", "no permission"),
    ("NVML_ERROR_UNKNOWN", "NVML error: Unknown Error"),
]


@pytest.mark.parametrize(("code", "reason"), INIT_ERRORS)
def test_init_error_maps_to_reason(code, reason):
    fake = FakeNvml([H200], init_fail=[code])
    reading = GpuMonitor(fake).read()
    assert reading == GpuReading((), reason)
    assert format_reading(reading) == [f"n/a: {reason}"]


def test_the_real_exception_classes_are_what_the_fake_raises():
    assert type(nvml_error("NVML_ERROR_LIBRARY_NOT_FOUND")) is pynvml.NVMLError_LibraryNotFound
    assert type(nvml_error("NVML_ERROR_GPU_IS_LOST")) is pynvml.NVMLError_GpuIsLost


@pytest.mark.parametrize(
    ("fn", "code", "reason"),
    [
        ("nvmlDeviceGetMemoryInfo", "NVML_ERROR_GPU_IS_LOST", "GPU is lost"),
        ("nvmlDeviceGetHandleByIndex", "NVML_ERROR_GPU_IS_LOST", "GPU is lost"),
        ("nvmlDeviceGetCount", "NVML_ERROR_NO_PERMISSION", "no permission"),
        ("nvmlDeviceGetUtilizationRates", "NVML_ERROR_GPU_IS_LOST", "GPU is lost"),
        ("nvmlDeviceGetMemoryInfo", "NVML_ERROR_TIMEOUT", "NVML error: Timeout"),
        ("nvmlDeviceGetMemoryInfo", "NVML_ERROR_NOT_SUPPORTED", "not supported"),
    ],
)
def test_device_error_maps_to_reason(fn, code, reason):
    reading = GpuMonitor(FakeNvml([L4, H200], fail={fn: code})).read()
    assert reading == GpuReading((), reason)


def test_non_nvml_exception_is_reported_not_raised():
    fake = FakeNvml([L4])
    fake.nvmlDeviceGetCount = lambda: 1 / 0
    reading = GpuMonitor(fake).read()
    assert reading.devices == ()
    assert reading.unavailable == "NVML error: ZeroDivisionError: division by zero"


def test_failed_init_is_retried_at_most_every_30_seconds():
    clock = FakeClock()
    fake = FakeNvml([L4], init_fail=["NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_DRIVER_NOT_LOADED"])
    monitor = GpuMonitor(fake, clock=clock)
    assert monitor.read().unavailable == "NVIDIA driver not loaded"
    clock.now += INIT_RETRY_S - 1
    assert monitor.read().unavailable == "NVIDIA driver not loaded"
    assert fake.init_count == 1  # answered from the cached reason
    clock.now += 1
    assert monitor.read().unavailable == "NVIDIA driver not loaded"
    assert fake.init_count == 2
    clock.now += INIT_RETRY_S
    reading = monitor.read()  # the driver got loaded meanwhile
    assert reading.unavailable is None and len(reading.devices) == 1
    assert fake.init_count == 3


def test_driver_lost_after_init_shuts_down_and_reinitialises_later():
    clock = FakeClock()
    fake = FakeNvml([L4], fail={"nvmlDeviceGetCount": "NVML_ERROR_LIB_RM_VERSION_MISMATCH"})
    monitor = GpuMonitor(fake, clock=clock)
    assert monitor.read().unavailable.startswith("driver/library version mismatch")
    assert fake.shutdown_count == 1
    del fake.fail["nvmlDeviceGetCount"]
    assert monitor.read().unavailable.startswith("driver/library version mismatch")  # throttled
    clock.now += INIT_RETRY_S
    assert monitor.read().unavailable is None
    assert fake.init_count == 2


def test_missing_pynvml_module_is_a_reason(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert GpuMonitor().read().unavailable == "pynvml not installed (pip install nvidia-ml-py)"


# --- read_async: a stalled NVML call times out ----------------------------------


async def test_read_async_times_out_on_a_stalled_call_and_recovers():
    release = threading.Event()
    fake = FakeNvml([L4], block=release)
    monitor = GpuMonitor(fake, timeout_s=0.05)
    try:
        assert await monitor.read_async() == GpuReading((), "NVML timed out")
        # Still stuck: no second thread, the same answer.
        threads = threading.active_count()
        assert (await monitor.read_async()).unavailable == "NVML timed out"
        assert threading.active_count() == threads
        assert fake.calls.count("nvmlInit") == 1
    finally:
        release.set()
    reading = await monitor.read_async(timeout_s=5)
    assert reading.unavailable is None
    assert reading.devices[0].name == "NVIDIA L4"


async def test_concurrent_read_async_share_one_thread():
    fake = FakeNvml([L4])
    monitor = GpuMonitor(fake, timeout_s=5)
    a, b = await asyncio.gather(monitor.read_async(), monitor.read_async())
    assert a.unavailable is None and b.unavailable is None
    assert fake.calls.count("nvmlDeviceGetCount") == 1  # the second waited on the first


def test_close_does_not_hang_while_a_call_is_stalled():
    release = threading.Event()
    fake = FakeNvml([L4], block=release)
    monitor = GpuMonitor(fake)
    t = threading.Thread(target=monitor.read, daemon=True)
    t.start()
    try:
        assert fake.entered.wait(5)  # the reader holds the lock and is blocked in NVML
        monitor.close(timeout_s=0.05)  # returns instead of waiting for the stalled call
        assert fake.shutdown_count == 0
    finally:
        release.set()
        t.join(5)
    monitor.close()
    assert fake.shutdown_count == 1
