"""``npusim noc``: synthetic traffic on the NoC model -- latency, throughput, link load.

Examples::

    npusim noc --mesh 8x8 --traffic uniform --rate 0.2 --packet-flits 4
    npusim noc --arch npusim-64c --traffic transpose --rate 0.1 --json
    npusim noc --mesh 8x8 --packet-flits 1 --vcs 16 --sweep
    npusim noc --mesh 4x4 --vcs 16 --buffer-flits 8 --booksim-compatible --rate 0.25

``--rate`` is the offered load in flits per node per cycle. NoC parameters come from
``--arch`` (mesh size from ``cores.grid``, the rest from ``noc``) or the schema
defaults; explicit flags override either. ``--cycles`` is the measurement window
(after ``--warmup`` cycles; measured packets are then drained).
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

from npusim.choices import NOC_FIDELITIES, TOPOLOGIES, TRAFFIC_PATTERNS
from npusim.cli.util import add_force_arg, refuse_unless_forced
from npusim.errors import ConfigError
from npusim.files import json_text

if TYPE_CHECKING:
    from npusim.hw.noc import NocParams, NocResult, SyntheticTraffic

DEFAULT_RATE = 0.1
SWEEP_REFINEMENTS = 3  # bisection steps between the last stable and the first saturated rate


def add_parser(sub):
    p = sub.add_parser(
        "noc",
        help="run synthetic traffic on the NoC model (latency, throughput, link utilisation)",
        description="Run synthetic traffic (uniform, transpose, bitcomp, hotspot, neighbor) on the NoC model "
        "and print latency, accepted throughput and per-link utilisation. --rate is the offered load in "
        "flits/node/cycle; parameters come from --arch (or the schema defaults), explicit flags override.",
    )
    p.add_argument("--arch", help="take NoC parameters and mesh size from this arch file or preset")
    p.add_argument("--mesh", help="WIDTHxHEIGHT, e.g. 8x8 (default: the arch grid, else 8x8)")
    p.add_argument("--topology", default="mesh", help=f"one of {', '.join(TOPOLOGIES)} (default mesh)")
    p.add_argument("--traffic", default="uniform", help=f"pattern: {', '.join(TRAFFIC_PATTERNS)} (default uniform)")
    p.add_argument("--rate", help=f"offered load, flits/node/cycle, in (0, 1] (default {DEFAULT_RATE})")
    p.add_argument("--packet-flits", default="1", help="flits per packet (default 1)")
    p.add_argument("--fidelity", default="flit", help=f"model: {', '.join(NOC_FIDELITIES)} (default flit)")
    p.add_argument("--cycles", default="10000", help="measurement window in cycles (default 10000)")
    p.add_argument("--warmup", default="1000", help="warm-up cycles before the window (default 1000)")
    p.add_argument("--seed", default="1", help="random seed (default 1)")
    p.add_argument("--vcs", help="virtual channels per port (arch noc.virtual_channels, default 2)")
    p.add_argument("--buffer-flits", help="flits per VC buffer (arch noc.buffer_depth_flits, default 8)")
    p.add_argument("--router-stages", help="router pipeline depth in cycles (arch noc.router_pipeline_cycles, default 4)")
    p.add_argument("--link-latency-cycles", help="link latency in cycles (arch noc.link_latency_cycles, default 1)")
    p.add_argument("--routing", help="xy or yx (arch noc.routing, default xy)")
    p.add_argument("--booksim-compatible", action="store_true",
                   help="flit model with BookSim2's iq_router conventions: iSLIP VC and switch allocation, "
                        "2-cycle body-flit pipeline, 1-cycle injection and ejection channels counted in the "
                        "latency (configure like BookSim2, e.g. --vcs 16 --buffer-flits 8, to get its curves)")
    p.add_argument("--hotspot-nodes", help="comma-separated router ids for --traffic hotspot (default: centre)")
    p.add_argument("--hotspot-fraction", default="0.2", help="share of packets sent to hotspots (default 0.2)")
    p.add_argument("--sweep", action="store_true", help="sweep the rate up to saturation and print the curve")
    p.add_argument("--sweep-step", default="0.05", help="rate step of --sweep (default 0.05)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_force_arg(p, f"more than {MAX_ROUTER_CYCLES:.0e} router-cycles (routers x (warm-up + window))")
    return p


#: router-cycles (routers x simulated cycles) a run takes without --force: about a minute at the flit
#: fidelity (~4 M router-cycles a second on one core), several at the path fidelity
MAX_ROUTER_CYCLES = 2e8


# ---- argument parsing (every problem is a one-line ConfigError) ------------------------

def _int(text, flag: str, minimum: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(str(text))
    except ValueError:
        raise ConfigError(f"{flag}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise ConfigError(f"{flag}: must be >= {minimum}, got {value}")
    if value > 2**31 - 1:
        raise ConfigError(f"{flag}: must be at most 2**31 - 1, got {value}")
    return value


def _float(text, flag: str) -> float:
    try:
        value = float(str(text))
    except ValueError:
        raise ConfigError(f"{flag}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{flag}: expected a finite number, got {text!r}")
    return value


def _rate(text, flag: str = "--rate") -> float:
    value = _float(text, flag)
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{flag}: the offered load must be in (0, 1] flits/node/cycle, got {value:g}")
    return value


def noc_params(args) -> NocParams:
    """NocParams from --arch (if given) with explicit flags overriding."""
    from npusim.hw.noc import NocParams
    from npusim.hw.noc.topology import parse_mesh

    overrides = dict(
        vcs=_int(args.vcs, "--vcs"),
        buffer_flits=_int(args.buffer_flits, "--buffer-flits"),
        router_stages=_int(args.router_stages, "--router-stages"),
        link_latency_cycles=_int(args.link_latency_cycles, "--link-latency-cycles"),
        routing=args.routing,
        topology=args.topology,
        booksim_compatible=True if getattr(args, "booksim_compatible", False) else None,
    )
    if args.topology not in TOPOLOGIES:
        raise ConfigError(f"--topology: unknown topology {args.topology!r}; known: {', '.join(TOPOLOGIES)}")
    if args.mesh is not None:
        overrides["width"], overrides["height"] = parse_mesh(args.mesh)
    if args.arch:
        from npusim.arch import load_arch

        return NocParams.from_arch(load_arch(args.arch), **overrides)
    return NocParams(**{k: v for k, v in overrides.items() if v is not None})


def synthetic_traffic(args, rate: float) -> SyntheticTraffic:
    from npusim.hw.noc import SyntheticTraffic

    hot = None
    if args.hotspot_nodes:
        try:
            hot = tuple(int(x) for x in args.hotspot_nodes.split(","))
        except ValueError:
            raise ConfigError(f"--hotspot-nodes: expected comma-separated router ids, got {args.hotspot_nodes!r}") from None
    return SyntheticTraffic(
        pattern=args.traffic,
        rate=rate,
        packet_flits=_int(args.packet_flits, "--packet-flits"),
        warmup_cycles=_int(args.warmup, "--warmup", minimum=0),
        measure_cycles=_int(args.cycles, "--cycles"),
        seed=_int(args.seed, "--seed", minimum=0),
        hotspot_nodes=hot,
        hotspot_fraction=_float(args.hotspot_fraction, "--hotspot-fraction"),
    )


# ---- running ------------------------------------------------------------------------

def _flag(flag: str, fn, *a):
    """Call ``fn(*a)``, prefixing a ConfigError's message with the flag it came from."""
    try:
        return fn(*a)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def run(args) -> int:
    from npusim.hw.noc.traffic import canonical_pattern
    from npusim.sim.noc_synthetic import simulator

    params = noc_params(args)
    simulate = _flag("--fidelity", simulator, args.fidelity)
    if params.booksim_compatible and args.fidelity != "flit":
        raise ConfigError(f"--booksim-compatible: only the flit fidelity has BookSim2's conventions, "
                          f"not --fidelity {args.fidelity}")
    _flag("--traffic", canonical_pattern, args.traffic)
    rate = _rate(args.rate if args.rate is not None else DEFAULT_RATE)
    traffic = synthetic_traffic(args, rate)  # validates everything before a long run
    work = params.width * params.height * (traffic.warmup_cycles + traffic.measure_cycles)
    refuse_unless_forced(args, work, MAX_ROUTER_CYCLES, "router-cycles",
                         f"~{work / 4e6 / 60:,.0f} minutes at the flit fidelity")
    if args.sweep:
        results = sweep(simulate, params, args, _rate(args.sweep_step, "--sweep-step"))
        _print_sweep(results, params, traffic, args.json)
        return 0
    result = simulate(params, traffic)
    if args.json:
        print(json_text(result.to_dict()))
    else:
        _print_result(result, params)
    return 0


def sweep(simulate, params: NocParams, args, step: float) -> list[NocResult]:
    """Results at rates step, 2*step, ... up to the first saturated one (or 1.0), then
    SWEEP_REFINEMENTS bisection points between the last stable and first saturated rate."""
    results = []
    k = 1
    while k * step <= 1.0 + 1e-9:
        res = simulate(params, synthetic_traffic(args, round(k * step, 6)))
        results.append(res)
        if res.saturated:
            break
        k += 1
    lo = max((r.offered_flits_per_node_cycle for r in results if not r.saturated), default=0.0)
    hi = min((r.offered_flits_per_node_cycle for r in results if r.saturated), default=None)
    for _ in range(SWEEP_REFINEMENTS if hi is not None else 0):
        mid = round((lo + hi) / 2, 6)
        if mid <= 0:
            break
        res = simulate(params, synthetic_traffic(args, mid))
        results.append(res)
        lo, hi = (lo, mid) if res.saturated else (mid, hi)
    return sorted(results, key=lambda r: r.offered_flits_per_node_cycle)


def _describe(params: NocParams, res: NocResult) -> str:
    conv = ", BookSim2 conventions" if params.booksim_compatible else ""
    return (f"{res.fidelity}-level NoC: {params.label}, {res.pattern} traffic, {res.packet_flits}-flit packets, "
            f"{params.vcs} VCs x {params.buffer_flits} flits, {params.router_stages}-stage routers, "
            f"{params.link_latency_cycles}-cycle links, {params.routing} routing{conv}")


def _fmt(x: float, spec: str = ".1f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def _print_result(res: NocResult, params: NocParams) -> None:
    util = res.link_utilization
    hottest = ", ".join(f"{name} {u:.3f}" for name, u in res.hottest_links(5))
    rows = [
        ("offered load", f"{res.offered_flits_per_node_cycle:.3f} flits/node/cycle "
                         f"(generated {res.generated_flits_per_node_cycle:.3f})"),
        ("accepted throughput", f"{res.accepted_flits_per_node_cycle:.3f} flits/node/cycle"),
        ("avg packet latency", f"{_fmt(res.avg_packet_latency_cycles)} cycles incl. source queueing "
                               f"(zero-load {_fmt(res.zero_load_latency_cycles)}, max {_fmt(res.max_packet_latency_cycles, '.0f')})"),
        ("avg network latency", f"{_fmt(res.avg_network_latency_cycles)} cycles (head injection to tail ejection)"),
        ("avg hops", _fmt(res.avg_hops, ".2f")),
        ("link utilisation", f"max {util.max() if util.size else 0:.3f}, mean {util.mean() if util.size else 0:.3f} "
                             f"flits/cycle over {util.size} links"),
        ("hottest links", hottest or "n/a"),
        ("saturated", f"yes: {res.saturation_reason}" if res.saturated else "no"),
        ("measured packets", f"{res.packets_delivered} of {res.packets_measured} delivered"),
        ("simulated", f"{res.cycles_simulated} cycles in {res.wall_seconds:.2f} s "
                      f"({res.router_cycles_per_second / 1e6:.2f} M router-cycles/s)"),
    ]
    print(_describe(params, res))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def _print_sweep(results: list[NocResult], params: NocParams, traffic: SyntheticTraffic, as_json: bool) -> None:
    stable = [r for r in results if not r.saturated]
    summary = {
        "saturation_offered_load": max((r.offered_flits_per_node_cycle for r in stable), default=None),
        "max_accepted_flits_per_node_cycle": max(r.accepted_flits_per_node_cycle for r in results),
        "zero_load_latency_cycles": results[0].zero_load_latency_cycles,
    }
    if as_json:
        print(json_text({"sweep": [_sweep_row(r) for r in results], **summary}))
        return
    print(_describe(params, results[0]))
    print(f"  {'offered':>8} {'accepted':>9} {'pkt lat':>8} {'net lat':>8} {'max link':>8}  saturated")
    for r in results:
        util = r.link_utilization.max() if r.link_utilization.size else 0.0
        sat = f"yes ({r.saturation_reason})" if r.saturated else "no"
        print(f"  {r.offered_flits_per_node_cycle:8.3f} {r.accepted_flits_per_node_cycle:9.3f} "
              f"{_fmt(r.avg_packet_latency_cycles):>8} {_fmt(r.avg_network_latency_cycles):>8} {util:8.3f}  {sat}")
    print(f"  highest stable offered load: {_fmt(summary['saturation_offered_load'], '.3f')} flits/node/cycle; "
          f"max accepted throughput: {summary['max_accepted_flits_per_node_cycle']:.3f} flits/node/cycle")


def _sweep_row(r: NocResult) -> dict:
    d = r.to_dict()
    d.pop("link_utilization")
    return d
