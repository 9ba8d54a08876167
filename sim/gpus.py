"""Identity of the simulated GPUs (what dcgm-exporter puts in labels) and the driver's Xid texts. No I/O."""

from __future__ import annotations

import uuid

MODEL = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "550.54.15"
FB_TOTAL_MIB = 81559

# PCI bus ids of the eight GPUs of a DGX H100 (DCGM's 8-digit-domain form).
_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# dcgm-exporter's err_msg texts (internal/pkg/collector/xid_errors.go) for the Xids the simulator is used
# with; other codes read "Unknown Error" here.
XID_TEXT = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    154: "GPU Recovery Action Changed",
}


# Xids after which the GPU cannot run CUDA work until it is reset or the node rebooted (NVIDIA's Xid catalogue:
# resolution RESET_GPU or RESTART_BM): a process using the GPU dies, and DCGM's diagnostic fails on it.
FATAL_XIDS = frozenset({48, 62, 64, 74, 79, 92, 94, 95, 109, 119, 120, 140, 143})
# The CUDA error a process using the GPU gets after such an Xid (cudaGetErrorString's texts).
_CUDA_ERROR = {48: "uncorrectable ECC error encountered", 94: "uncorrectable ECC error encountered",
               95: "uncorrectable ECC error encountered", 140: "uncorrectable ECC error encountered"}  # fmt: skip


def xid_text(code: int) -> str:
    return XID_TEXT.get(code, "Unknown Error")


def cuda_error(xid: int) -> str:
    """The CUDA runtime's error string for a process whose GPU had Xid ``xid`` (one of :data:`FATAL_XIDS`)."""
    return _CUDA_ERROR.get(xid, "unspecified launch failure")


def pci_bus_id(gpu: int) -> str:
    """DCGM's form, e.g. ``00000000:5D:00.0``; GPUs past the eighth get made-up buses."""
    bus = _BUS_IDS[gpu] if gpu < len(_BUS_IDS) else f"{0xE0 + gpu:02X}"
    return f"00000000:{bus}:00.0"


def kernel_pci(gpu: int) -> str:
    """The kernel log's form of the same device, e.g. ``0000:5d:00``."""
    return pci_bus_id(gpu)[4:-2].lower()


def gpu_uuid(node: str, gpu: int) -> str:
    """A stable UUID per (node, gpu), in NVIDIA's ``GPU-`` form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{gpu}.{node}.sim.nightshift')}"
