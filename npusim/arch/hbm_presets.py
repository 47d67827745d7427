"""Named DRAM organisations + timing sets for ``hbm.preset`` (HBM2 / HBM3 pseudo-channel mode).

Sources: the HBM timing presets of public DRAM simulators (Ramulator2's HBM2-2000, HBM2-2400 and
HBM3-6400 presets; the DRAMSys HBM2 memspec shipped with NPU-SIM, the NpuSim study's simulator):

* The Ramulator2 presets give tCK, pin rate, CL (and CWL for HBM3), tRCD read/write, tRP, tRAS,
  tRC, tCCD_S/L, tFAW (HBM3), tREFI and the organisation (2 pseudo-channels per channel,
  4 bank groups x 4 banks; 64-bit pseudo-channels for HBM2, 32-bit for HBM3).
* What those presets leave out is taken from the DRAMSys HBM2 memspec shipped with NPU-SIM
  (tCK 1 ns): tFAW 16 ns (HBM2), tRRD_S 4 ns, tRRD_L 6 ns, tRFCsb 96 ns, tWL 7, tWR 14 ns;
  DRAMsim3's HBM2 config gives the same tRRD_S/L. As Ramulator2 itself does for HBM3 (whose
  timings were not published), these absolute times are carried to the faster parts by
  converting ns to cycles (rounded up).
* tRFC 260 ns is Ramulator2's HBM2 refresh table for 4 Gb dies; tREFI 3.9 us.

Every value below is in tCK cycles of the preset's own ``tck_ns``; ``channels`` and
``capacity_gb`` are the chip's and must be given next to ``preset``. A channel's bandwidth
is ``2 x bus_width_bits / 8 x pin_rate_gbps``: HBM2-2400 2 x 19.2 = 38.4 GB/s, HBM3-6400
2 x 25.6 = 51.2 GB/s per channel (8 / 16 channels per stack: 307 / 819 GB/s).
"""

from __future__ import annotations

import math


def _cycles(ns: float, tck_ns: float) -> int:
    return int(math.ceil(ns / tck_ns - 1e-9))


def _hbm2(tck_ns: float, pin_rate: float, cl: int, trcd: int, trcdwr: int, trp: int, tras: int, trc: int) -> dict:
    c = lambda ns: _cycles(ns, tck_ns)  # noqa: E731
    return {
        "tck_ns": tck_ns, "pin_rate_gbps": pin_rate, "bus_width_bits": 64, "burst_length": 4,
        "pseudo_channels": 2, "banks": 16, "bank_groups": 4, "row_bytes": 1024,
        "timing": {
            "unit": "cycles", "tCL": cl, "tRCD": trcd, "tRCDWR": trcdwr, "tRP": trp, "tRAS": tras, "tRC": trc,
            "tCCD": 2, "tCCD_L": 4, "tRRD_S": c(4), "tRRD_L": c(6), "tFAW": c(16),
            "tWL": 7, "tWR": c(14), "tWTR": 9, "tRTW": 4,
            "tREFI": c(3900), "tRFC": c(260), "tRFCsb": c(96),
        },
    }


HBM_PRESETS: dict[str, dict] = {
    # Ramulator2 HBM2-2000: tCK 1.0 ns, 2.0 Gb/s, CL 14, tRCD 14/12, tRP 14, tRAS 34, tRC 48, tCCD 2/4
    "hbm2-2000": _hbm2(1.0, 2.0, 14, 14, 12, 14, 34, 48),
    # Ramulator2 HBM2-2400 (HBM2e class): tCK 0.833 ns, 2.4 Gb/s, CL 17, tRCD 17/14, tRP 17, tRAS 40, tRC 57
    "hbm2-2400": _hbm2(0.833, 2.4, 17, 17, 14, 17, 40, 57),
    # Ramulator2 HBM3-6400: tCK 0.625 ns, 6.4 Gb/s, CL 20 (CWL 10), tRCD 31/15, tRP 26, tRAS 45, tRC 72,
    # tCCD 2/4, tFAW 24, tREFI 6240; 32-bit pseudo-channels, BL8 (32 B per burst)
    "hbm3-6400": {
        "tck_ns": 0.625, "pin_rate_gbps": 6.4, "bus_width_bits": 32, "burst_length": 8,
        "pseudo_channels": 2, "banks": 16, "bank_groups": 4, "row_bytes": 1024,
        "timing": {
            "unit": "cycles", "tCL": 20, "tWL": 10, "tRCD": 31, "tRCDWR": 15, "tRP": 26, "tRAS": 45, "tRC": 72,
            "tCCD": 2, "tCCD_L": 4, "tFAW": 24, "tRRD_S": _cycles(4, 0.625), "tRRD_L": _cycles(6, 0.625),
            "tWR": _cycles(14, 0.625), "tWTR": _cycles(9, 0.625), "tRTW": 4,
            "tREFI": 6240, "tRFC": _cycles(260, 0.625), "tRFCsb": _cycles(96, 0.625),
        },
    },
}
