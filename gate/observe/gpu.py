"""GPU memory and utilisation through NVML; the only module that imports ``pynvml``.

Everything here degrades to a reading that says why it has no numbers
(``GpuReading.unavailable``, e.g. ``"NVML library not found"``): a host without
a GPU, without the driver, after a driver upgrade without a reboot, or with a
lost GPU still runs the gate, and the console shows ``n/a: <reason>``.

* ``pynvml`` (from the ``nvidia-ml-py`` distribution) is imported lazily, inside
  :meth:`GpuMonitor._ensure_init`, so ``import gate.gpu`` never fails.
* NVML is initialised once, under a lock, on the first read.  A failed
  initialisation is retried at most every :data:`INIT_RETRY_S` seconds (a driver
  may get loaded later); in between, reads answer the cached reason at once.
* A field the device does not support (``NotSupported``; for the optional
  fields also ``NoPermission``) becomes ``None`` (utilisation, reserved memory)
  or ``()`` (processes); it does not fail the whole reading.
* NVML calls block, and may stall when a GPU is lost: :meth:`GpuMonitor.read`
  is blocking; :meth:`GpuMonitor.read_async` runs it on a daemon thread with a
  timeout and never starts a second thread while one is still stuck.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

# The reading is plain data the console renders: it lives with the snapshot.
from gate.data.snapshot import GpuDevice, GpuProcess, GpuReading, format_reading
from gate.observe.metrics import GateMetrics

__all__ = [
    "GpuDevice",
    "GpuMonitor",
    "GpuProcess",
    "GpuReading",
    "INIT_RETRY_S",
    "format_reading",
    "reason_for",
]

INIT_RETRY_S = 30.0
DEFAULT_TIMEOUT_S = 2.0
GIB = 1024**3

TIMED_OUT = "NVML timed out"
NOT_INSTALLED = "pynvml not installed (pip install nvidia-ml-py)"
NO_GPUS = "no NVIDIA GPU found"

# NVML return codes -> the operator's short reason.  Looked up by *name* on the
# nvml module in use, so a fake module only needs the same constants.
_REASONS: dict[str, str] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "NVML library not found",
    "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA driver not loaded",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver/library version mismatch (reboot after driver upgrade?)",
    "NVML_ERROR_NO_PERMISSION": "no permission",
    "NVML_ERROR_GPU_IS_LOST": "GPU is lost",
    "NVML_ERROR_NOT_SUPPORTED": "not supported",
}
# Errors after which NVML must be initialised again (subject to INIT_RETRY_S).
_REINIT = ("NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "NVML_ERROR_UNINITIALIZED")
# Optional fields treat these as "not available" rather than as a failed reading.
_FIELD_MISSING = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION")


def _code_name(nvml: Any, code: object) -> str | None:
    for name in (*_REASONS, *_REINIT):
        if getattr(nvml, name, object()) == code:
            return name
    return None


def reason_for(nvml: Any, err: BaseException) -> str:
    """The short operator-facing reason for an exception raised by NVML."""
    nvml_error = getattr(nvml, "NVMLError", None)
    if nvml_error is not None and isinstance(err, nvml_error):
        name = _code_name(nvml, getattr(err, "value", None))
        if name in _REASONS:
            return _REASONS[name]
        return f"NVML error: {err}"
    return f"NVML error: {type(err).__name__}: {err}"


def _as_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuSource(Protocol):
    """Where GPU readings come from: NVML (`GpuMonitor`), or the demo's simulated device."""

    def read(self) -> GpuReading: ...

    async def read_async(self, timeout_s: float | None = None) -> GpuReading: ...

    def close(self, timeout_s: float = 1.0) -> None: ...


class GpuMonitor:
    """Reads every NVIDIA GPU's memory, utilisation and compute processes.

    ``nvml`` is the pynvml module or a stand-in exposing the same functions
    (``nvmlInit``, ``nvmlShutdown``, ``nvmlDeviceGetCount``,
    ``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetName``,
    ``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetUtilizationRates``,
    ``nvmlDeviceGetComputeRunningProcesses``), ``NVMLError`` and the
    ``NVML_ERROR_*`` constants (``nvmlMemory_v2`` optional).  Default: pynvml,
    imported on the first read.
    """

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml: Any = nvml
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()  # guards NVML state; serialises NVML calls
        self._initialised = False
        self._init_error: str | None = None
        self._init_failed_at: float | None = None
        self._memory_v2 = True  # cleared when the driver lacks nvmlDeviceGetMemoryInfo_v2
        self._in_flight: asyncio.Future[GpuReading] | None = None  # read_async's thread, while it runs

    # --- lifecycle -----------------------------------------------------------

    def _ensure_init(self) -> str | None:
        """Initialise NVML if needed (lock held); return a reason when it is unavailable."""
        if self._initialised:
            return None
        now = self._clock()
        if self._init_failed_at is not None and now - self._init_failed_at < INIT_RETRY_S:
            return self._init_error
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return self._init_failed(NOT_INSTALLED, now)
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
        except Exception as err:  # NVMLError or anything else: never raise out of read()
            return self._init_failed(reason_for(self._nvml, err), now)
        self._initialised = True
        self._init_error = self._init_failed_at = None
        return None

    def _init_failed(self, reason: str, now: float) -> str:
        self._init_error, self._init_failed_at = reason, now
        return reason

    def _shutdown_locked(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass  # already gone; nothing to release

    def close(self, timeout_s: float = 1.0) -> None:
        """Release NVML (reference counted: one shutdown per successful init).

        Gives up after ``timeout_s`` when a stalled NVML call holds the lock:
        closing must never hang the gate's shutdown.
        """
        if not self._lock.acquire(timeout=timeout_s):
            return
        try:
            self._shutdown_locked()
        finally:
            self._lock.release()

    # --- reading ---------------------------------------------------------------

    def read(self) -> GpuReading:
        """One reading of every device.  BLOCKING (run it off the event loop); never raises."""
        with self._lock:
            reason = self._ensure_init()
            if reason is not None:
                return GpuReading.failed(reason)
            nvml = self._nvml
            try:
                count = nvml.nvmlDeviceGetCount()
                if count == 0:
                    return GpuReading.failed(NO_GPUS)
                devices = tuple(self._read_device(i) for i in range(count))
            except Exception as err:
                reason = reason_for(nvml, err)
                if (_code_name(nvml, getattr(err, "value", None)) or "") in _REINIT:
                    self._shutdown_locked()
                    self._init_failed(reason, self._clock())
                return GpuReading.failed(reason)
            return GpuReading(devices=devices, unavailable=None)

    def _optional(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None when NVML says the field is not supported / not permitted."""
        try:
            return fn()
        except Exception as err:
            nvml_error = getattr(self._nvml, "NVMLError", None)
            if nvml_error is not None and isinstance(err, nvml_error):
                if _code_name(self._nvml, getattr(err, "value", None)) in _FIELD_MISSING:
                    return None
            raise

    def _memory(self, handle: Any) -> tuple[int, int, int | None]:
        """(used, total, reserved) bytes: memory info v2 when the driver has it, else v1."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if self._memory_v2 and version is not None:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return int(mem.used), int(mem.total), int(mem.reserved)
            except Exception as err:
                if _code_name(nvml, getattr(err, "value", None)) == "NVML_ERROR_GPU_IS_LOST":
                    raise
                # FunctionNotFound / ArgumentVersionMismatch / NotSupported on older
                # drivers, or a stand-in without ``version=``: use v1 from now on.
                self._memory_v2 = False
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(mem.used), int(mem.total), None

    def _read_device(self, index: int) -> GpuDevice:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = self._optional(lambda: _as_text(nvml.nvmlDeviceGetName(handle))) or "GPU"
        used, total, reserved = self._memory(handle)
        util = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        procs = self._optional(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or ()
        processes = tuple(
            GpuProcess(
                pid=int(p.pid),
                used_bytes=None if getattr(p, "usedGpuMemory", None) is None else int(p.usedGpuMemory),
            )
            for p in procs
        )
        return GpuDevice(
            index=index,
            name=name,
            used_bytes=used,
            total_bytes=total,
            reserved_bytes=reserved,
            utilization_pct=None if util is None else int(util.gpu),
            processes=processes,
        )

    async def read_async(self, timeout_s: float | None = None) -> GpuReading:
        """:meth:`read` on a daemon thread, bounded by ``timeout_s`` (default: the monitor's).

        On timeout the answer is ``unavailable="NVML timed out"``; the stuck call
        keeps its thread, and until it returns every call answers the same at
        once instead of starting another thread.  A daemon thread (not
        ``asyncio.to_thread``) so that a stalled NVML call never blocks the
        process from exiting.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self._in_flight is not None and not self._in_flight.done():
            if self._in_flight.get_loop() is asyncio.get_running_loop():
                try:
                    async with asyncio.timeout(timeout):
                        return await asyncio.shield(self._in_flight)
                except TimeoutError:
                    return GpuReading.failed(TIMED_OUT)
            return GpuReading.failed(TIMED_OUT)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[GpuReading] = loop.create_future()

        def deliver(reading: GpuReading) -> None:
            if not fut.done():
                fut.set_result(reading)

        def work() -> None:
            reading = self.read()
            try:
                loop.call_soon_threadsafe(deliver, reading)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        self._in_flight = fut
        threading.Thread(target=work, name="tokengate-nvml", daemon=True).start()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(fut)
        except TimeoutError:
            return GpuReading.failed(TIMED_OUT)


async def read_gpu(source: GpuSource, metrics: GateMetrics) -> GpuReading:
    """One reading (in a worker thread), reflected in the GPU gauges; n/a clears them."""
    reading = await source.read_async()
    if reading.unavailable:
        metrics.clear_gpu()
    for d in reading.devices:
        metrics.set_gpu(str(d.index), used=d.used_bytes, total=d.total_bytes)
    return reading
