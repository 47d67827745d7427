"""How busy the flit NoC keeps a saturated link: micro-benchmarks on the cycle-accurate routers.

Issue 42 item 2 (session 48). The path NoC's flows and streams fill a saturated mesh link to its
width; on the memory workloads the flit model keeps its hottest links ~80% busy
(``validation/memory_flows_vs_flit.py``). This script measures, on the flit model alone (the
reference, itself checked against BookSim2), how much of one output link's width the routers use
when several inputs contend for it, so that a link-efficiency law, if there is one, comes from the
bottom and not from the GEMM or step numbers.

Part A, *one hot output* (open loop, every source always backlogged,
:func:`npusim.hw.noc.flit.saturated_throughput`): on a 7x7 mesh with XY routing the link from
router X = (3, 3) to D = (3, 4) (X's south output) is fed by up to four of X's inputs: its local
port, W (a source on X's row to the west, turning south at X), E (the same from the east) and N (a
source above X on its column). Every source sends packets of ``F`` flits to D (``beyond``: to the
router below D, so the measured link is not the last hop). Throughput of the link (flits per cycle
over the window, 1.0 = its width) for every subset of the inputs, sources 1 and 3 hops from X,
``F`` in 1, 2, 4, 16 at the preset's routers (2 VCs x 8 flits, 4 stages), and at ``F`` = 4 with
1 x 8, 4 x 8, 2 x 4 and 2 stages.

Part B, *the textbook HOL case*: router X as a 2x2 switch (inputs W and E, two backlogged sources
each; outputs N and S) and a 3x3 one (inputs W, E and X's own NI; outputs N, S and X's ejection
port), every packet's output drawn uniformly; throughput per output beside Karol, Hluchyj and
Morgan (1987)'s saturation of an n x n input-queued switch with FIFO inputs and uniform traffic
(0.75 for n = 2, 0.6825 for n = 3, 2 - sqrt(2) = 0.586 as n grows; Monte Carlo of their model), and
the flows' head-of-line model's rate per output (:func:`npusim.hw.noc.hol.mesh_flow_rates`, session 49).

Part C, *the memory patterns in the engine*: ``memory_flows_vs_flit.py``'s all-core ``stream``,
``random`` and ``stream-write`` on npusim-64c (memory analytical): the flows' and the flit model's
makespans, their flits on every link (equal), the busy fraction of the link the flows fill, every
2,000 cycles at the flit model beside the busiest link's, and the flit and flow makespans as the
DMA engines' tags, the VCs and the buffers change.

Part E, *head-of-line blocking across two routers*: link X -> D is fed by a source W of X and one N
of X; at D their packets eject or continue south to D2 = (3, 5), where ``m`` = 0..3 other inputs
of D (its E and W neighbours, its own NI, each backlogged towards D2) contend for D's south
output. ``split``: the W source sends only to D, the N source only to D2; ``mixed``: both send half
their packets to each (a DMA's fixed proportions). The flit model's X -> D throughput beside the
max-min fair rate the flows would give it (:func:`npusim.hw.maxmin.maxmin_rates` over the two links)
and the rate of the flows with the head-of-line coupling (:func:`npusim.hw.noc.hol.mesh_flow_rates`:
the whole mesh, each source's NI and destination's ejection port 1 flit a cycle). These are the
coupling's calibration: the flit model's own routers, nothing tuned to them.

Part F, *what the input port's VCs are doing* (session 50): the flit model stepped a cycle at a time,
and each cycle the state of the two VCs of one input port (the preset's 2 VCs x 8 flits, 4-flit
packets unless said): its front flit active (its packet holds the output, and a VC of it when the output is a
link), waiting in VC allocation (a head no VC of its output is free for), without a credit, or no
ready flit; and the flits the port sent. For part E's X -> D (D's north input; ``split`` and
``mixed``, m = 1..3, 4- and 1-flit packets) and part B's 2x2 switch (X's west input). The share of cycles of each joint
state and the flits a cycle the port sends in it, beside the port's ``eta`` in the flows'
head-of-line model (:func:`npusim.hw.noc.hol.mesh_flow_rates`). Slow (a Python loop over the
cycles: ~1 minute).

Part G, *the workloads' regime* (session 55): where the flows' coupling takes its throughput on
``memory_flows_vs_flit.py``'s 64c GEMMs (sampled at the path flows: 70-90% of a coupled link's flits
leave by the contended output, one input of the link's source router carries 50-100% of them, and the
others ahead there are ``N`` ~ 0.25-1). Link X -> D carries one backlogged source's flits (N of X), a
share ``h`` continuing south at D (to D2), the rest ejecting at D; one other input of D (its E
neighbour, backlogged) sends a share ``s`` of its flits south through D, the rest to its own south
neighbour. The flit model's X -> D and D -> D2 beside max-min and the flows with the coupling
(:func:`npusim.hw.noc.hol.mesh_flow_rates`), for 1- and 4-flit packets; then, at ``h`` = 0.8, ``s`` =
1, 1-flit packets, part F's VC states of both inputs of D that contend for its south output.

    python validation/noc_link_saturation.py [--part ABCEFG] [--cycles N] [--law waits|fifo-fluid]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.hw.noc.flit import saturated_throughput  # noqa: E402
from npusim.hw.noc.topology import PORT_N, PORT_S  # noqa: E402
from npusim.hw.noc.traffic import NocParams  # noqa: E402

W = H = 7
X = (3, 3)
LAW = "waits"  #: the flows' coupling law in the model columns (``--law``; :func:`npusim.hw.noc.hol.mesh_flow_rates`)


def rid(x, y):
    return y * W + x


def source_of(direction: str, dist: int) -> int:
    """The router ``dist`` hops from X whose XY route to D enters X by input ``direction``."""
    x, y = X
    return {"L": rid(x, y), "W": rid(x - dist, y), "E": rid(x + dist, y), "N": rid(x, y - dist)}[direction]


def saturate(params: NocParams, F: int, flows, cycles: int, warmup: int, eject: bool = False):
    """:func:`npusim.hw.noc.flit.saturated_throughput`: flits a cycle per output port (and, with
    ``eject``, the network's ejections a cycle)."""
    thr, ej = saturated_throughput(params, F, flows, cycles, warmup)
    return (thr, None, ej) if eject else (thr, None)


def params(vcs: int = 2, buf: int = 8, S: int = 4) -> NocParams:
    return NocParams(width=W, height=H, vcs=vcs, buffer_flits=buf, router_stages=S)


def part_a(cycles: int) -> None:
    print("Part A: one hot output (X's south link), every source backlogged; throughput in flits/cycle")
    xo = rid(*X) * 5 + PORT_S
    dirs = ["L", "W", "E", "N"]
    cfgs = [(2, 8, 4), (1, 8, 4), (4, 8, 4), (2, 4, 4), (2, 8, 2)]
    print(f"{'inputs':>8} {'hops':>4} {'beyond':>6} " + " ".join(f"{'F=%d %dx%d S%d' % (F, v, b, s):>13}"
                                                          for v, b, s in cfgs[:1] for F in (1, 2, 4, 16))
          + " " + " ".join(f"{'F=4 %dx%d S%d' % (v, b, s):>12}" for v, b, s in cfgs[1:]))
    for k in range(1, 5):
        for subset in itertools.combinations(dirs, k):
            for dist in (1, 3):
                if dist == 3 and subset == ("L",):
                    continue
                for beyond in (False, True):
                    dst = rid(X[0], X[1] + (2 if beyond else 1))
                    flows = [(source_of(d, dist), [dst]) for d in subset]
                    cells = []
                    for v, b, s in cfgs[:1]:
                        for F in (1, 2, 4, 16):
                            thr, _ = saturate(params(v, b, s), F, flows, cycles, 2000)
                            cells.append(f"{thr[xo]:13.3f}")
                    for v, b, s in cfgs[1:]:
                        thr, _ = saturate(params(v, b, s), 4, flows, cycles, 2000)
                        cells.append(f"{thr[xo]:12.3f}")
                    print(f"{'+'.join(subset):>8} {dist:4d} {str(beyond):>6} " + " ".join(cells), flush=True)


def karol(n: int, slots: int = 200_000, seed: int = 1) -> float:
    """Saturation throughput per output of an n x n input-queued switch with one FIFO per input,
    every input backlogged, destinations uniform, contention resolved at random (Monte Carlo of
    Karol, Hluchyj and Morgan 1987's model; their Table I: 0.7500, 0.6825, 0.6553 for n = 2, 3, 4,
    2 - sqrt(2) = 0.5858 as n grows)."""
    rng = np.random.default_rng(seed)
    heads = rng.integers(n, size=n)
    served = 0
    for _ in range(slots // n):
        taken = np.zeros(n, bool)
        for i in rng.permutation(n):
            if not taken[heads[i]]:
                taken[heads[i]] = True
                heads[i] = rng.integers(n)
                served += 1
    return served / (slots // n) / n


def _hol_per_output(flows, n: int) -> float:
    """Flits a cycle per output of the flows with the head-of-line coupling (every flit leaves by
    one of the ``n`` outputs; :func:`npusim.hw.noc.hol.mesh_flow_rates`)."""
    from npusim.hw.noc.hol import mesh_flow_rates
    rate, _ = mesh_flow_rates(W, H, [(1.0, [(src, d, 1.0 / len(dsts)) for d in dsts]) for src, dsts in flows], law=LAW)
    return float(rate.sum()) / n


def part_b(cycles: int) -> None:
    """Router X as an n x n switch under uniform traffic (module docstring)."""
    print("Part B: router X as a 2x2 / 3x3 switch, inputs backlogged, destinations uniform; "
          "flits/cycle per output")
    x, y = X
    north, south = rid(x, y - 1), rid(x, y + 1)
    r = rid(x, y)
    print(f"{'switch':>22} {'F':>3} " + " ".join(f"{'%dx%d' % (v, b):>6}" for v, b in ((1, 8), (2, 8), (4, 8), (8, 8)))
          + "   Karol (FIFO, cells)")
    for F in (1, 4, 16):
        # 2x2: inputs W and E (two sources each), outputs N and S
        flows = [(s_, [north, south]) for s_ in (rid(x - 1, y), rid(x - 2, y), rid(x + 1, y), rid(x + 2, y))]
        cells = []
        for v, b in ((1, 8), (2, 8), (4, 8), (8, 8)):
            thr, _ = saturate(params(v, b), F, flows, cycles, 2000)
            cells.append(f"{(thr[r * 5 + PORT_N] + thr[r * 5 + PORT_S]) / 2:6.3f}")
        print(f"{'2x2 W,E -> N,S':>22} {F:3d} " + " ".join(cells) + f"   {karol(2):.4f}   HOL model {_hol_per_output(flows, 2):.3f}",
              flush=True)
    for F in (4, 16):
        # 3x3: inputs W, E and X's own NI, outputs N, S and X's ejection port
        flows = [(s_, [north, south, r]) for s_ in (rid(x - 1, y), rid(x + 1, y), r)]
        cells = []
        for v, b in ((1, 8), (2, 8), (4, 8), (8, 8)):
            thr, _, ej = saturate(params(v, b), F, flows, cycles, 2000, eject=True)
            # every flit ejects at N, S or X: X's ejection is the rest of the network's (steady state)
            cells.append(f"{ej / 3:6.3f}")
        print(f"{'3x3 W,E,L -> N,S,L':>22} {F:3d} " + " ".join(cells) + f"   {karol(3):.4f}   HOL model {_hol_per_output(flows, 3):.3f}",
              flush=True)


def _hol_xd(flows, xr: int, dr: int) -> float:
    """Flits a cycle on link ``xr -> dr`` by the flows with the head-of-line coupling
    (:func:`npusim.hw.noc.hol.mesh_flow_rates`): each source backlogged (1 flit a cycle at its NI),
    its packets spread evenly over its destinations."""
    from npusim.hw.noc.hol import mesh_flow_rates
    spec = [(1.0, [(src, d, 1.0 / len(dsts)) for d in dsts]) for src, dsts in flows]
    rate, _ = mesh_flow_rates(W, H, spec, law=LAW)
    total = 0.0
    for f, (src, dsts) in enumerate(flows):
        for d in dsts:
            x, y, dx, dy = src % W, src // W, d % W, d // W
            path = [(x + i * (1 if dx > x else -1), y) for i in range(abs(dx - x) + 1)]
            path += [(dx, y + i * (1 if dy > y else -1)) for i in range(1, abs(dy - y) + 1)]
            hops = [(rid(*a), rid(*b)) for a, b in zip(path, path[1:])]
            if (xr, dr) in hops:
                total += rate[f] / len(dsts)
    return total


def part_e(cycles: int) -> None:
    """Head-of-line blocking across two routers (module docstring), flit against max-min."""
    from npusim.hw.maxmin import maxmin_rates, new_scratch
    print("Part E: link X->D fed by W and N of X; at D its traffic ejects or continues south, where m "
          "other inputs of D contend; flits/cycle")
    x, y = X
    D, D2 = rid(x, y + 1), rid(x, y + 2)
    others = [rid(x + 1, y + 1), rid(x - 1, y + 1), D]  # E and W inputs of D, D's own NI
    xo, do = rid(x, y) * 5 + PORT_S, D * 5 + PORT_S
    cfgs = [(2, 8, 4), (1, 8, 4), (4, 8, 4), (16, 8, 4), (2, 32, 4), (2, 8, 2)]
    print(f"{'mode':>9} {'m':>2} {'F':>3} {'max-min X->D':>12} {'+ HOL':>6} " + " ".join(f"{'%dx%d S%d' % c:>9}" for c in cfgs)
          + "   (flit X->D; D->D2 at the preset)")
    for mode in ("split", "mixed"):
        for m in range(4):
            for F in (1, 4):
                if mode == "split":  # W of X only to D, N of X only beyond D
                    flows = [(rid(x - 1, y), [D]), (rid(x, y - 1), [D2])]
                    coef = [{"XD": 1.0}, {"XD": 1.0, "DD2": 1.0}]
                else:  # W and N of X each send half their packets to D, half beyond
                    flows = [(rid(x - 1, y), [D, D2]), (rid(x, y - 1), [D, D2])]
                    coef = [{"XD": 1.0, "DD2": 0.5}, {"XD": 1.0, "DD2": 0.5}]
                flows += [(o, [D2]) for o in others[:m]]
                coef += [{"DD2": 1.0}] * m
                # max-min over the two links (the sources' NIs and the ejection ports do not bind here)
                nf, res = len(coef), {"XD": 0, "DD2": 1}
                e_n = np.array([len(c) for c in coef], np.int64)
                e_res = np.zeros((nf, 2), np.int64)
                e_coef = np.zeros((nf, 2))
                for f, c in enumerate(coef):
                    for k, (name, a) in enumerate(c.items()):
                        e_res[f, k], e_coef[f, k] = res[name], a
                rate = np.zeros(nf)
                cap = np.ones(nf)  # a source's NI injects a flit a cycle
                maxmin_rates(nf, np.arange(nf), e_n, e_res, e_coef, cap, np.ones(2), rate, new_scratch(2, nf, 2 * nf),
                             1e-12)
                mm = float(sum(rate[f] * coef[f].get("XD", 0.0) for f in range(nf)))
                hol = _hol_xd(flows, rid(x, y), D)
                cells, dd2 = [], 0.0
                for c in cfgs:
                    thr, _ = saturate(params(*c), F, flows, cycles, 2000)
                    cells.append(f"{thr[xo]:9.3f}")
                    if c == cfgs[0]:
                        dd2 = thr[do]
                print(f"{mode:>9} {m:2d} {F:3d} {mm:12.3f} {hol:6.3f} " + " ".join(cells) + f"   D->D2 {dd2:.3f}",
                      flush=True)


def _pattern_sim(kind: str, noc: str, tags: int = 0, vcs: int = 0, buf: int = 0):
    """``memory_flows_vs_flit.py``'s all-core pattern on npusim-64c (every DMA engine of every core,
    256 KiB a core in 4 DMAs an engine), memory analytical; ``tags``/``vcs``/``buf`` (0: the preset's)
    override ``cores.dma.max_outstanding``, ``noc.virtual_channels``, ``noc.buffer_depth_flits``."""
    from npusim.arch import load_arch
    from npusim.hw.memory.hbm import PATTERN_RANDOM
    from npusim.sim import Simulator
    arch = load_arch("npusim-64c")
    if tags:
        dma = arch.cores.dma.model_copy(update={"max_outstanding": tags})
        arch = arch.model_copy(update={"cores": arch.cores.model_copy(update={"dma": dma})})
    if vcs or buf:
        noc_upd = {k: v for k, v in (("virtual_channels", vcs), ("buffer_depth_flits", buf)) if v}
        arch = arch.model_copy(update={"noc": arch.noc.model_copy(update=noc_upd)})
    sim = Simulator(arch, memory_mode="analytical", noc_mode=noc, memory_streams="flow")
    size = (256 << 10) // sim.dma_engines // 4
    a = 0
    for c in range(arch.num_cores):
        for e in range(sim.dma_engines):
            prev = ()
            for _ in range(4):
                t = sim.add_dma(c, size, address=a, write=kind == "stream-write", dma_engine=e,
                                pattern=PATTERN_RANDOM if kind == "random" else 0, deps=prev)
                prev = (t,)
                a += size
    return sim


def part_c(cycles: int, interval: int = 2000) -> None:
    """The memory patterns in the engine (module docstring): where the flit model loses time."""
    print("Part C: npusim-64c, every core streaming (memory analytical); hot = the link the flows fill")
    for kind in ("stream", "random", "stream-write"):
        flows = _pattern_sim(kind, "path")
        flows.run()
        lp = flows.link_flits().astype(float)
        hot = int(np.argmax(lp))
        topo = flows.topology
        sim = _pattern_sim(kind, "flit")
        t, prev, hot_i, max_i = 0, sim.link_flits(), [], []
        while True:
            t += interval
            sim.run(until=t)
            lf = sim.link_flits()
            d = (lf - prev) / interval
            prev = lf
            if d.max() == 0 and lf.sum() > 0:  # the traffic is over
                break
            hot_i.append(d[hot])
            max_i.append(d.max())
        lf = sim.link_flits().astype(float)
        span = sim.makespan()
        steady = hot_i[1:-2]  # leave out the first and the last intervals
        print(f"{kind:>12}: flows {flows.makespan()} cycles, flit {span} cycles ({flows.makespan() / span - 1:+.1%}); "
              f"link flits equal in both: {bool(np.array_equal(lf, lp))}; hot link {topo.link_name(hot)} busy "
              f"{lp[hot] / flows.makespan():.3f} (flows) / {lf[hot] / span:.3f} (flit, over the run)")
        print(f"{'':>14}flit, per {interval} cycles: hot link " + " ".join(f"{h:.2f}" for h in hot_i)
              + f"\n{'':>14}flit, per {interval} cycles: busiest link " + " ".join(f"{m:.2f}" for m in max_i)
              + f"\n{'':>14}hot link's median over the steady intervals {np.median(steady):.3f}", flush=True)
    print("Part C, flit makespan (cycles) of 'stream' and 'random' as tags, VCs and buffers change "
          "(preset: 32 tags = 8 bursts in flight an engine, 2 VCs x 8 flits):")
    for tags, vcs, buf in ((32, 2, 8), (16, 2, 8), (64, 2, 8), (128, 2, 8), (32, 1, 8), (32, 4, 8), (32, 16, 8),
                           (32, 2, 32), (32, 16, 128)):
        cells = []
        for kind in ("stream", "random"):
            sim = _pattern_sim(kind, "flit", tags, vcs, buf)
            sim.run()
            ref = _pattern_sim(kind, "path", tags, vcs, buf)
            ref.run()
            cells.append(f"{kind} flit {sim.makespan():6d} flows {ref.makespan():6d} ({ref.makespan() / sim.makespan() - 1:+.1%})")
        print(f"  tags {tags:3d} VCs {vcs:2d} x {buf:3d} flits: " + "; ".join(cells), flush=True)


def vc_states(flows, r: int, port: int, cycles: int, warmup: int = 2000, F: int = 4, seed: int = 1):
    """Part F: the joint state of the 2 VCs of input ``port`` of router ``r`` every cycle of a
    backlogged run of ``flows`` (as :func:`npusim.hw.noc.flit.saturated_throughput`, 2 VCs x 8 flits,
    4 stages), and the flits the port sends in each. A VC's state: ``A`` its ready front holds its
    output (and a VC there, at a link), ``w`` a ready head without a VC (waiting in VC allocation),
    ``c`` no credit, ``-`` no ready flit; ``A,w same`` when the waiting head wants the active one's
    output. Returns ``({state: (share of cycles, flits a cycle sent there)}, port throughput, {output
    port: flits a cycle the port sends there})``."""
    from npusim.hw.noc import flit_kernel as fk
    from npusim.hw.noc.flit import make_state, send
    from npusim.hw.noc.routing import build_routing
    from npusim.hw.noc.topology import PORT_LOCAL, to_arrays
    p = params(2, 8, 4)
    topo = to_arrays(p.build_graph())
    st = make_state(topo, build_routing(topo, p.routing), 2, 8, 4, source_queue_packets=64)
    rng = np.random.default_rng(seed)
    P, V, B = int(st.cfg[fk.C_P]), 2, 8
    ip = r * P + port
    occ: dict = {}
    sent: dict = {}
    by_out: dict = {}  # flits a cycle the port sends to each output
    for cyc in range(warmup + cycles):
        for src, dsts in flows:
            while st.node[src, fk.ND_SQ_CNT] < 32:
                d = dsts[0] if len(dsts) == 1 else dsts[int(rng.integers(len(dsts)))]
                send(st, int(src), int(d), F, cyc, 0)
        heads = [int(st.vc[ip * V + v, fk.VC_HEAD]) for v in range(V)]
        cnts = [int(st.vc[ip * V + v, fk.VC_COUNT]) for v in range(V)]
        fronts = []
        for v in range(V):
            s = (ip * V + v) * B + heads[v]
            if cnts[v] == 0 or st.slot[s, fk.SL_READY] > cyc:
                fronts.append(None)
            else:
                fronts.append(int(fk._route(st.next_port, st.rt, r, int(st.pkt[int(st.slot[s, fk.SL_PKT]), fk.PK_DST]))))
        fk.step(st, cyc)
        if cyc < warmup:
            continue
        states, outs, n = [], [], 0
        for v in range(V):
            popped = cnts[v] > 0 and int(st.vc[ip * V + v, fk.VC_HEAD]) != heads[v]
            n += popped
            o = fronts[v]
            if popped:
                by_out[o] = by_out.get(o, 0) + 1
            outs.append(o)
            if o is None:
                states.append("-")
            elif popped or st.vc[ip * V + v, fk.VC_OUTPORT] >= 0:
                ov = (r * P + o) * V + int(st.vc[ip * V + v, fk.VC_OUTVC])
                states.append("c" if not popped and o != PORT_LOCAL and st.vc[ov, fk.OV_CREDITS] <= 0 else "A")
            else:
                states.append("w")
        key = ",".join(sorted(states))
        if key == "A,w":
            key += " same" if outs[0] == outs[1] else " other"
        occ[key] = occ.get(key, 0) + 1
        sent[key] = sent.get(key, 0) + n
    tot = sum(sent.values())
    return ({k: (occ[k] / cycles, sent[k] / occ[k]) for k in sorted(occ, key=lambda k: -occ[k])}, tot / cycles,
            {o: n / cycles for o, n in sorted(by_out.items())})


def _outputs_line(outs) -> str:
    """:func:`vc_states`' flits a cycle by output port, as ``L 0.1 S 0.4``."""
    return " ".join(f"{'LNESW'[o]} {v:.3f}" for o, v in outs.items())


def _states_line(table) -> str:
    """:func:`vc_states`' joint states: share of cycles / flits a cycle sent in it."""
    return "  ".join(f"{k} {a:.3f}/{b:.2f}" for k, (a, b) in table.items())


def part_f(cycles: int) -> None:
    """What the input port's VCs are doing (module docstring)."""
    from npusim.hw.noc.hol import mesh_flow_rates
    from npusim.hw.noc.topology import PORT_W
    print("Part F: joint state of the input port's 2 VCs (A active, w waiting in VC allocation, c no credit, "
          "- no ready flit): share of cycles / flits a cycle sent there")
    x, y = X
    D, D2 = rid(x, y + 1), rid(x, y + 2)
    others = [rid(x + 1, y + 1), rid(x - 1, y + 1), D]
    cases = []
    for mode in ("split", "mixed"):
        for m in (1, 2, 3):
            if mode == "split":
                flows = [(rid(x - 1, y), [D]), (rid(x, y - 1), [D2])]
            else:
                flows = [(rid(x - 1, y), [D, D2]), (rid(x, y - 1), [D, D2])]
            for F in (4, 1):
                cases.append((f"E {mode} m={m} F={F}, X->D", flows + [(o, [D2]) for o in others[:m]], D, PORT_N,
                              (rid(x, y), D), F))
    cases.append(("B 2x2 F=4, W->X", [(s_, [rid(x, y - 1), rid(x, y + 1)]) for s_ in
                                  (rid(x - 1, y), rid(x - 2, y), rid(x + 1, y), rid(x + 2, y))],
                  rid(x, y), PORT_W, (rid(x - 1, y), rid(x, y)), 4))
    for label, flows, r, port, link, F in cases:
        table, thr, outs = vc_states(flows, r, port, cycles, F=F)
        spec = [(1.0, [(src, d, 1.0 / len(dsts)) for d in dsts]) for src, dsts in flows]
        rate, eta = mesh_flow_rates(W, H, spec, law=LAW)
        model = {}  # the flows' flits a cycle on the link, by the output they take at its router
        for f, (src, dsts) in enumerate(flows):
            for d in dsts:
                hops = _route_hops(src, d)
                if link in hops:
                    i = hops.index(link)
                    o = _out_name(hops[i + 1]) if i + 1 < len(hops) else "L"
                    model[o] = model.get(o, 0.0) + rate[f] / len(dsts)
        print(f"{label:>26}: flit {thr:.3f} ({_outputs_line(outs)}), flows + HOL {sum(model.values()):.3f} ("
              + " ".join(f"{o} {v:.3f}" for o, v in sorted(model.items()))
              + f"; eta {eta[link]:.3f})\n{'':>28}" + _states_line(table), flush=True)


def part_g(cycles: int) -> None:
    """The workloads' regime (module docstring)."""
    from npusim.hw.noc.hol import mesh_flow_rates
    from npusim.hw.noc.topology import PORT_E
    print("Part G: X->D carries one source's flits, a share h on through D's south output, where D's E input "
          "sends a share s of its own; flits/cycle")
    x, y = X
    D, D2 = rid(x, y + 1), rid(x, y + 2)
    p_src, e_src, e_other = rid(x, y - 1), rid(x + 1, y + 1), rid(x + 1, y + 2)
    xo, do = rid(x, y) * 5 + PORT_S, D * 5 + PORT_S
    print(f"{'h':>4} {'s':>5} {'F':>2} {'max-min X->D':>12} {'+ HOL':>6} {'flit X->D':>9} {'HOL / flit':>10} {'flit D->D2':>10}")
    for h in (0.6, 0.8, 0.9):
        for share in (0.25, 0.5, 1.0):
            n_on, n_e = int(round(10 * h)), int(round(4 * share))  # packets drawn uniformly from these lists
            flows = [(p_src, [D2] * n_on + [D] * (10 - n_on)), (e_src, [D2] * n_e + [e_other] * (4 - n_e))]
            spec = [(1.0, [(p_src, D2, h), (p_src, D, 1.0 - h)]),
                    (1.0, [(e_src, D2, share)] + ([(e_src, e_other, 1.0 - share)] if share < 1.0 else []))]
            plain, _ = mesh_flow_rates(W, H, spec, hol=False)
            hol, _ = mesh_flow_rates(W, H, spec, law=LAW)
            for F in (1, 4):
                thr, _ = saturate(params(), F, flows, cycles, 2000)
                print(f"{h:4.1f} {share:5.2f} {F:2d} {plain[0]:12.3f} {hol[0]:6.3f} {thr[xo]:9.3f} "
                      f"{100 * (hol[0] / thr[xo] - 1):+9.1f}% {thr[do]:10.3f}", flush=True)
    flows = [(p_src, [D2] * 8 + [D] * 2), (e_src, [D2])]
    for label, port in (("D's N input (X->D)", PORT_N), ("D's E input", PORT_E)):
        table, thr, outs = vc_states(flows, D, port, cycles, F=1)
        print(f"h 0.8, s 1, F 1, {label}: flit {thr:.3f} ({_outputs_line(outs)})\n    " + _states_line(table), flush=True)


def _route_hops(src: int, dst: int):
    """The links (router pairs) of the XY route ``src -> dst`` on the W x H mesh."""
    x, y, dx, dy = src % W, src // W, dst % W, dst // W
    path = [(x + i * (1 if dx > x else -1), y) for i in range(abs(dx - x) + 1)]
    path += [(dx, y + i * (1 if dy > y else -1)) for i in range(1, abs(dy - y) + 1)]
    return [(rid(*a), rid(*b)) for a, b in zip(path, path[1:])]


def _out_name(hop) -> str:
    """The output port of router ``hop[0]`` a link ``hop`` leaves by."""
    a, b = hop
    return {-W: "N", 1: "E", W: "S", -1: "W"}[b - a]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="ABCE", help="parts to run (letters; F and G on request)")
    ap.add_argument("--cycles", type=int, default=20000, help="measurement window (cycles) of each run")
    ap.add_argument("--law", choices=("waits", "fifo-fluid"), default="waits",
                    help="the flows' head-of-line law in the model columns: the simulator's (waits, default) "
                         "or session 56's fluid candidate (fifo-fluid; mesh_flow_rates only)")
    args = ap.parse_args(argv)
    global LAW
    LAW = args.law
    print(machine_line())
    for part, fn in (("A", part_a), ("B", part_b), ("C", part_c), ("E", part_e), ("F", part_f), ("G", part_g)):
        if part in args.part.upper():
            fn(args.cycles)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
