"""Where random reads lose against the DRAM bound on two-pseudo-channel HBM: the command trace per
refresh window, for shared and pseudo-channel-partitioned controller queues (issue 12, section 2).

The npusim-64c chip with an HBM preset as 32 channels x 2 pseudo-channels (as
validation/hbm_timing.py), every DMA engine reading random 64-byte blocks. From the command
trace, each pseudo-channel's ACT rate as a fraction of its activation limit (one ACT per
max(tRRD_S, tFAW/4)) in three kinds of windows:

* ``other PC refreshing``: the tRP + tRFC of an all-bank refresh of the *other* pseudo-channel
  of its channel (all channels' pseudo-channel k refresh at the same time, as in Ramulator2,
  DRAMSys and gem5, whose refresh timers all start at tREFI);
* ``own refresh +1us``: the microsecond after its own refresh ends;
* ``elsewhere``: the rest (its own refresh excluded).

It then prints the achieved fraction of ``bound_gbps``, and the same with refresh off
(``tREFI: 0``). A rate far under 1 while the other pseudo-channel refreshes means this one ran out
of requests: DMA engines whose next request waits for a full queue issue nothing else (the TLM
exclusion rule), and during a refresh they pile up on the refreshing pseudo-channel.

    python validation/hbm_queue_starvation.py [--preset hbm2-2400] [--bytes 8MiB]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hbm_timing import PRESETS, preset_chip  # noqa: E402

from npusim.arch.schema import Arch, merge_arch_data  # noqa: E402
from npusim.cli.util import parse_size  # noqa: E402
from npusim.hw.memory.bounds import bandwidth_bound  # noqa: E402
from npusim.hw.memory.hbm import C_CMDLOG_N, CMD_ACT, CMD_REF, PATTERN_RANDOM  # noqa: E402
from npusim.hw.memory.params import P_TFAW, P_TRFC, P_TRP, P_TRRD_S, memory_params  # noqa: E402
from npusim.sim import Simulator  # noqa: E402


def run(arch: Arch, nbytes: int) -> dict:
    p, _ = memory_params(arch)
    interval = max(p[P_TRRD_S], p[P_TFAW] / 4)
    blocked = p[P_TRP] + p[P_TRFC]
    engines = arch.cores.dma.engines
    n = arch.num_cores * engines
    sim = Simulator(arch, memory_over_noc=False, cmdlog_rows=6 * nbytes // 64 + 1000)  # the DRAM alone
    for i in range(n):
        sim.add_dma(i // engines, nbytes // n, address=i * (nbytes // n), dma_engine=i % engines,
                    pattern=PATTERN_RANDOM)
    sim.run()
    log = sim.mem.cmdlog[: sim.mem.counters[C_CMDLOG_N]]
    assert len(log) < sim.mem.cmdlog.shape[0], "command trace full"
    acts, refs = log[log[:, 1] == CMD_ACT], log[log[:, 1] == CMD_REF]
    end = float(log[:, 0].max())
    counts = {"other PC refreshing": [0, 0.0], "own refresh +1us": [0, 0.0], "elsewhere": [0, 0.0]}
    npc = arch.hbm.pseudo_channels
    for ch in range(arch.hbm.channels):
        for pc in range(npc):
            t = acts[(acts[:, 2] == ch) & (acts[:, 3] == pc), 0]
            own = refs[(refs[:, 2] == ch) & (refs[:, 3] == pc), 0]
            other = refs[(refs[:, 2] == ch) & (refs[:, 3] != pc), 0]
            used = np.zeros(len(t), bool)
            span_used = 0.0
            for key, starts, lo, hi in (("other PC refreshing", other, -p[P_TRP], blocked - p[P_TRP]),
                                        ("own refresh +1us", own, blocked - p[P_TRP], blocked - p[P_TRP] + 1e6)):
                for s in starts:
                    if s + hi <= end:
                        m = (t >= s + lo) & (t < s + hi) & ~used
                        counts[key][0] += int(m.sum())
                        counts[key][1] += hi - lo
                        used |= m
                        span_used += hi - lo
            own_blocked = sum(blocked for _ in own)
            counts["elsewhere"][0] += int((~used).sum())
            counts["elsewhere"][1] += end - span_used - own_blocked
    rates = {k: c * interval / span if span > 0 else float("nan") for k, (c, span) in counts.items()}
    time_ps = sim.makespan() / arch.clock_ghz * 1000.0  # as npusim mem measures it
    bound = bandwidth_bound(p, sim.mem.u_burst_ps, sim.mem.u_tccd_ps, "random", duration_ps=time_ps)
    rates["of bound"] = (nbytes // n * n) / time_ps * 1000.0 / bound["bound_gbps"]
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="hbm2-2400", choices=PRESETS)
    ap.add_argument("--bytes", type=parse_size, default="8MiB")
    args = ap.parse_args()
    base = preset_chip(args.preset)
    print(f"{base.name}, {args.bytes:,} bytes of random 64-byte reads over all DMA engines")
    print("ACT rate / activation limit per window of a pseudo-channel; last column: achieved / bound_gbps")
    print(f"{'queues':<12} {'refresh':<8} {'other PC refreshing':>20} {'own refresh +1us':>17} {'elsewhere':>10} "
          f"{'of bound':>9}")
    for refresh in (True, False):
        for partitioned in (False, True):
            hbm = {"partitioned_queues": partitioned}
            if not refresh:
                hbm["timing"] = {"tREFI": 0}
            arch = Arch.model_validate(merge_arch_data(base.model_dump(), {"hbm": hbm}))
            r = run(arch, args.bytes)
            print(f"{'partitioned' if partitioned else 'shared':<12} {'on' if refresh else 'off':<8} "
                  f"{r['other PC refreshing']:>20.3f} {r['own refresh +1us']:>17.3f} {r['elsewhere']:>10.3f} "
                  f"{100 * r['of bound']:>8.1f}%")


if __name__ == "__main__":
    main()
