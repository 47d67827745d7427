"""CloudMatrix384 point-to-point bandwidth and 512 B latency vs the paper's Table 1.

Source: CloudMatrix384 paper (arXiv 2506.12708), Table 1 (npusim/validate/published.yaml).
Table 1 is CALIBRATION, not validation: the cloudmatrix384 preset's switch latency, protocol
efficiencies and per-transfer overheads were derived from it (see the preset's header):

* switch latency from the NPU-NPU rows (intra- vs inter-node latency, read and write);
* efficiencies and overheads from the intra-node columns of all four rows.

The inter-node columns of the NPU-CPU rows were not used: they are held-out predictions. Each
cell is simulated with ``npusim fabric`` (flow model): bandwidth with a 256 MiB transfer
(sustained rate), latency with a 512 B one; intra-node = npu0.die0 to npu1.die0 / cpu0,
inter-node = npu0.die0 to npu8.die0 / cpu4. Exit status 1 if a cell is off by more than 10%.

    python validation/fabric_table1.py [--fidelity flow|packet]
"""

from __future__ import annotations

import argparse
import sys

from npusim.system.load import load_system
from npusim.validate.published import published
from npusim.system.measure import point_to_point

TOLERANCE = 0.10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fidelity", choices=["flow", "packet"], default="flow")
    args = ap.parse_args()
    pub = published()["cloudmatrix384_table1"]
    loaded = load_system("cloudmatrix384", nodes=2)
    print(f"CloudMatrix384 Table 1 ({pub['source']})")
    print(f"fabric model: {args.fidelity}; role: {pub['role']} (held-out cells marked *)\n")
    print(f"{'pair':8s} {'op':5s} {'where':6s} {'quantity':10s} {'published':>10s} {'simulated':>10s} {'error':>8s}  verdict")
    worst = 0.0
    for row in pub["rows"]:
        target = {"npu-npu": ("npu1.die0", "npu8.die0"), "npu-cpu": ("cpu0", "cpu4")}[row["pair"]]
        for where, dst in zip(("intra", "inter"), target):
            held_out = row["pair"] == "npu-cpu" and where == "inter"
            bw = point_to_point(loaded, "npu0.die0", dst, row["op"], 256 << 20, args.fidelity).bandwidth_gbps
            lat = point_to_point(loaded, "npu0.die0", dst, row["op"], 512, args.fidelity).latency_us
            for quantity, pub_value, simulated, unit in (("bandwidth", row[f"{where}_gbps"], bw, "GB/s"),
                                                         ("latency", row[f"{where}_us"], lat, "us")):
                err = simulated / pub_value - 1
                worst = max(worst, abs(err))
                verdict = "ok" if abs(err) <= TOLERANCE else "OFF"
                mark = "*" if held_out else " "
                print(f"{row['pair']:8s} {row['op']:5s} {where:6s} {quantity:10s} {pub_value:>8g} {unit:4s}"
                      f"{simulated:>8.3g} {err:>+8.1%}  {verdict}{mark}")
    print(f"\nworst error {worst:.1%} (tolerance {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
