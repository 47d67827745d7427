"""The NpuSim study's heterogeneous-decode experiment (rows A8 of ``npusim validate``) beside NPU-SIM
on the configuration its artefact ships (issue 42, item 5).

What the study's artefact (NPU-SIM, github.com/doulujiyao12/npu-sim at 290debf) holds for A8, read
at the source:

* workload ``llm/test/gpt2_small/pd_split/pd_split_42_21_100_100.json``: ``mode: sched_pds`` (PD
  disaggregation), 42 prefill and 21 decode cores, 7 stages each (6 prefill and 3 decode pipelines
  of one core a stage, TP 1); every stage core runs 4 GPT-2-style blocks (LayerNorm, fused QKV,
  attention, projection, a GELU FFN of 4C): 28 blocks of hidden 1280 (20 heads of 64, 5 K/V heads);
  ``count: 200`` requests of 100 prompt tokens, ``arrival: [1]`` (all at 1 ns), each stopping after
  ``2 / eof_chance`` = 100 decode tokens (``config_helper_pds.cpp``); a decode pipeline batches at
  most ``CORE_CREDIT`` = 5 requests (``llm/include/macros/macros.h``);
* chips ``llm/test/gpt2_small/pd_split_hete/{base,1..11}.json``: an 8x8 mesh, 8 MiB SRAM a core,
  cores 0-41 64x64 arrays at ``dram_bw`` 32, cores 42-63 (decode) at the variant's array and
  ``dram_bw``; NPU-SIM's behavioural DRAM moves ``15 x dram_bw / 8`` bytes/ns at ``--beha_dram_util``
  0.7 (``llm/src/utils/memory_utils.cpp``), so ``dram_bw`` 16/32/64/128/256 are the study's
  30/60/120/240/480 GB/s;
* the authors' results of those runs, ``plot/pdhete/{name}_analysis_results.json`` (their first
  entry is the 100_100 workload), plotted by ``plot/pdhete/draw_single.py``: their
  ``throughput_tokens_per_second`` is all tokens of all requests (the prefill's first token
  included) over the makespan (``total_tokens / max_completion_time``, times in ps; the
  ``calculate_single.py`` at 290debf divides by the mean latency instead, which those files do not).

The A8 rows' runner (``npusim.validate.hetero``) builds Qwen3-4B on the study's per-core-DRAM chip
with PD 42:21 and 7:7 stages (TP 6 prefill, TP 3 decode), 24 requests of 64 in / 256 out at 40/s
(``--quick``: 8 of 64 / 128), the per-core DRAM off the mesh, and divides output tokens by the
makespan. Columns, for each decode-core variant (GB/s / array):

* ``study figure (NPU-SIM)``: with ``--npu-sim DIR``, the throughput the authors' recorded results
  store, which is what the figure plots. It mixes two definitions: ``base_analysis_results.json``
  (64x64 at 60 GB/s, the baseline) holds all tokens over the makespan (907 tok/s), every variant's
  file all tokens over the *mean* request latency (as ``calculate_single.py`` at 290debf computes):
  240 GB/s 2080 tok/s. Their ratio, 2.29, is the published x2.28 (x2.18 per area with
  ``draw_single.py``'s areas; its x1.9 per area is 32x32 at 120 GB/s over the same base);
* ``NPU-SIM like for like``: the same runs, every one's tokens over its makespan (over the mean
  latency in the second figure of each cell): 60 -> 240 GB/s is x1.34 (x1.34 over the mean
  latency), 64x64 -> 32x32 at 240 GB/s x0.75;
* ``NPU-SIM here``: with ``--run-npu-sim``, NPU-SIM run on the artefact's workload brought to its
  current parser (:func:`patch_workload`) with ``--npu-sim-requests``. At 290debf it does not
  finish: it prefills, starts the first decode step and then spins without advancing (5 requests,
  killed after 10 minutes), so the recorded results are the NPU-SIM column;
* ``npusim A8``: the runner as ``npusim validate`` builds it;
* ``npusim A8, DRAM on mesh``: the same with the per-core DRAM reached over the mesh (the runner
  before session 47: every core's DRAM data through its 64 B/cycle ejection port);
* ``npusim artefact load``: the runner changed only in the workload, the artefact's requests
  (``--npusim-requests`` of 100 in / 100 out, all at t = 0).

Each throughput is given both ways (all tokens over the makespan, as the recorded results and
npusim's summary count it; and over the mean request latency, as ``calculate_single.py`` at 290debf
does), with the mean token gap, then the A8 ratios of the makespan throughput.

    python validation/npu_sim_a8.py [--quick] [--npu-sim DIR [--run-npu-sim]] [--npusim-requests 200]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import git_head, machine_line  # noqa: E402

from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.validate.chips import hetero_chip  # noqa: E402
from npusim.validate.hetero import HeteroSetup, area_mm2  # noqa: E402
from npusim.validate.published import study_figure  # noqa: E402

WORKLOAD = "llm/test/gpt2_small/pd_split/pd_split_42_21_100_100.json"
CHIPS = "llm/test/gpt2_small/pd_split_hete"
RECORDED = "plot/pdhete"
#: (decode GB/s, decode array) -> NPU-SIM's core-config name in CHIPS / RECORDED (dram_bw x 15/8 = GB/s)
VARIANTS = {(60, 64): "base", (120, 64): "1", (240, 64): "2", (480, 64): "5", (120, 32): "6", (240, 32): "3"}
#: the A8 rows: (key, label, numerator variant, denominator variant, per area)
ROWS = (("A8_bw_60_240", "decode DRAM 60->240 GB/s tok/s", (240, 64), (60, 64), False),
        ("A8_bw_60_240_area", "decode DRAM 60->240 GB/s tok/s/mm2", (240, 64), (60, 64), True),
        ("A8_bw_240_480", "decode DRAM 240->480 GB/s tok/s", (480, 64), (240, 64), False),
        ("A8_array_64_32", "decode array 64->32 tok/s", (240, 32), (240, 64), False),
        ("A8_array_64_32_area", "decode array 64->32 tok/s/mm2", (240, 32), (240, 64), True))


def metrics(token_times: list[list[float]], arrivals: list[float]) -> dict:
    """Throughput of one run from each request's token times (s) two ways: the artefact's
    (``plot/pdhete/calculate_single.py``: all tokens / mean of each request's last token time,
    arrivals all at ~0) and npusim's summary's (tokens after the first / (last finish - first
    arrival)); the mean token gap (TBT, s) and the mean last-token time."""
    done = [(t, a) for t, a in zip(token_times, arrivals) if t]
    if not done:
        raise ValueError("no request produced a token")
    last = [t[-1] - a for t, a in done]
    span = max(t[-1] for t, _ in done) - min(arrivals)
    tokens = sum(len(t) for t, _ in done)
    gaps = [g for t, _ in done for g in (t[i + 1] - t[i] for i in range(len(t) - 1))]
    return {"tok_s_mean_latency": tokens / statistics.mean(last), "tok_s_makespan": tokens / span,
            "tbt_ms": 1e3 * statistics.mean(gaps) if gaps else float("nan"),
            "mean_latency_s": statistics.mean(last), "requests": len(done)}


# -- the study's recorded results and NPU-SIM run here ------------------------------------------------
def recorded(npu_sim: Path) -> dict:
    """The authors' result per variant: the first (100_100) entry of ``{name}_analysis_results.json``."""
    out = {}
    for v, name in VARIANTS.items():
        path = npu_sim / RECORDED / f"{name}_analysis_results.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        key, entry = next(iter(data.items()))
        if not key.endswith(Path(WORKLOAD).name):
            raise SystemExit(f"{path}: first entry is {key}, expected the {Path(WORKLOAD).name} workload")
        # its times are ps; "figure": the throughput it stores (the figure's bar: tokens over the
        # makespan in base's file, over the mean latency in the variants' files, see the docstring)
        tokens = entry["total_tokens"]
        out[v] = {"tok_s_figure": entry["throughput_tokens_per_second"] * 1e3,
                  "tok_s_makespan": tokens / (entry["max_completion_time_ns"] / 1e12),
                  "tok_s_mean_latency": tokens / (entry["latency"]["mean"] / 1e12),
                  "tbt_ms": entry["tbt"]["mean"] / 1e9, "mean_latency_s": entry["latency"]["mean"] / 1e12,
                  "requests": entry["request_count"]}
    return out


def parse_token_records(text: str) -> list[list[float]]:
    """The last ``*config*`` block of NPU-SIM's ``token_records.txt``: per request its token times,
    SystemC time stamps in ps (``sc_time_stamp().to_double()``), returned in s."""
    block = text.rsplit("*\n", 1)[-1]
    reqs: dict[int, list[float]] = {}
    cur = None
    for line in block.splitlines():
        m = re.match(r"Request (\d+):", line)
        if m:
            cur = reqs.setdefault(int(m.group(1)), [])
            continue
        m = re.match(r"Token (\d+): ([0-9.eE+-]+)", line)
        if m and cur is not None:
            cur.append(float(m.group(2)) * 1e-12)
    return [reqs[k] for k in sorted(reqs)]


def patch_workload(cfg: dict, requests: int) -> list[str]:
    """The A8 workload brought to NPU-SIM 290debf's ``sched_pds`` parser, as its current-format
    ``llm/test/chores/pd_split.json`` has it: ``cores.decoding`` -> ``cores.decode`` (the key
    ``config_helper_pds.cpp`` reads), a ``cast`` list in every work, ``job_type`` a number,
    ``matmul_forward_pd`` given ``R`` (``pd_prims.h`` lists it as a parameter); and ``count``."""
    done = [f"requests.count 200 -> {requests}"]
    cfg["requests"]["count"] = requests
    cores = cfg["chips"][0]["cores"]
    if "decoding" in cores:
        cores["decode"] = cores.pop("decoding")
        done.append("cores.decoding -> cores.decode")
    for group in cores.values():
        for core in group:
            for work in core["worklist"]:
                if "cast" not in work:
                    work["cast"] = []
                    done.append("worklist cast: [] added")
                for prim in work["prims"]:
                    if isinstance(prim.get("job_type"), str):
                        prim["job_type"] = int(prim["job_type"])
                        done.append("job_type string -> number")
                    if prim["type"] == "matmul_forward_pd" and "R" not in prim:
                        prim["R"] = "R"
                        done.append("matmul_forward_pd R added")
    return sorted(set(done), key=done.index)


def run_npu_sim(npu_sim: Path, variant: tuple[int, int], requests: int, tmp: Path, timeout_s: float) -> dict:
    """NPU-SIM on the patched A8 workload (:func:`patch_workload`) and the variant's chip; None
    when it does not finish within ``timeout_s`` (at 290debf it prefills, starts the first decode
    step on core 42 and then spins without advancing: seen with 5 requests, killed after 10 min)."""
    build = npu_sim / "build"
    if not (build / "npusim").exists():
        raise SystemExit(f"{build / 'npusim'} not found: build NPU-SIM first (see its README)")
    cfg = json.loads((npu_sim / WORKLOAD).read_text())
    patch_workload(cfg, requests)
    work = tmp / f"a8_{requests}.json"
    work.write_text(json.dumps(cfg))
    chip = npu_sim / CHIPS / f"{VARIANTS[variant]}.json"
    argv = ["./npusim", "--config-file", str(work), "--core-config-file", str(chip), "--verbose-level", "0"]
    records = build / "token_records.txt"
    offset = records.stat().st_size if records.exists() else 0
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=build, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    wall = time.perf_counter() - t0
    with open(records, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", errors="replace")
    times = parse_token_records(text)
    if p.returncode or len(times) != requests:
        raise SystemExit(f"NPU-SIM failed ({p.returncode}) or wrote {len(times)} of {requests} requests' tokens: "
                         f"{' '.join(argv)} in {build}\n{p.stderr[-800:]}")
    return {**metrics(times, [0.0] * len(times)), "wall_s": wall, "command": " ".join(argv)}


# -- npusim ------------------------------------------------------------------------------------------
def run_npusim(variant: tuple[int, int], setup: HeteroSetup, rate: float, input_len: int, output_len: int,
               requests: int) -> dict:
    """npusim's A8 runner (``npusim.validate.hetero.run``) on one variant with the given workload."""
    reqs = synthetic_requests(requests, rate, input_len=input_len, output_len=output_len, seed=3)
    spec = spec_from_flags(tp=4, stages=1).model_copy(update={"data_parallel": 1})
    if setup.pd_stages:
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pd_stages": setup.pd_stages})})
    cfg = ServingConfig(model="qwen3-4b", scheduler=SchedulerConfig(policy="continuous", chunk_tokens=256),
                        memory_over_noc=setup.memory_over_noc)
    arch = hetero_chip(*variant)
    t0 = time.perf_counter()
    run = simulate_serving(arch, spec, reqs, cfg, pd=(42, 21))
    wall = time.perf_counter() - t0
    recs = [r for r in run.records if r.completed]
    out = metrics([r.token_times_s for r in recs], [r.arrival_s for r in recs])
    out.update(summary_tok_s=run.summary["throughput_tokens_per_s"], area_mm2=area_mm2(arch), wall_s=wall)
    return out


def ratio(res: dict, a, b, key: str, per_area: bool, areas: dict) -> float | None:
    if a not in res or b not in res:
        return None
    x, y = res[a][key], res[b][key]
    if per_area:
        x, y = x / areas[a], y / areas[b]
    return x / y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the A8 runner's quick setup (as npusim validate --quick)")
    ap.add_argument("--npu-sim", type=Path, default=None,
                    help="an NPU-SIM checkout: its authors' recorded results (plot/pdhete) become a column")
    ap.add_argument("--run-npu-sim", action="store_true",
                    help="with --npu-sim: also run DIR/build/npusim on the (patched) workload here")
    ap.add_argument("--npu-sim-requests", type=int, default=20,
                    help="requests.count of NPU-SIM's runs here (the artefact: 200; default 20)")
    ap.add_argument("--npu-sim-timeout", type=float, default=600, help="seconds before an NPU-SIM run is given up")
    ap.add_argument("--npusim-requests", type=int, default=200,
                    help="requests of npusim's artefact-load column (the artefact: 200)")
    ap.add_argument("--variants", default=",".join(f"{b}:{a}" for b, a in VARIANTS),
                    help="decode variants GBPS:ARRAY, comma-separated")
    args = ap.parse_args()
    variants = [tuple(int(x) for x in v.split(":")) for v in args.variants.split(",")]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"variant {v}: known {sorted(VARIANTS)}")
    setup = HeteroSetup(requests=8, output_len=128) if args.quick else HeteroSetup()
    on_mesh = replace(setup, memory_over_noc=True)
    cols: dict[str, dict] = {}
    loads: dict[str, str] = {}
    t_start = time.perf_counter()
    if args.npu_sim is not None:
        npu_sim = args.npu_sim.resolve()
        rec = recorded(npu_sim)
        cols["study figure (NPU-SIM)"] = {v: {**r, "tok_s_makespan": r["tok_s_figure"]} for v, r in rec.items()}
        loads["study figure (NPU-SIM)"] = (
            f"the throughput the authors' NPU-SIM results store ({npu_sim / RECORDED}), as the figure plots it: "
            "base's is tokens over the makespan, every variant's tokens over the mean latency")
        cols["NPU-SIM like for like"] = rec
        loads["NPU-SIM like for like"] = ("the same runs, every variant's tokens over its makespan: 200 req of 100/100 "
                                          "at t = 0, GPT-2-style 28 x hidden 1280, TP 1, 6 prefill + 3 decode "
                                          "pipelines of 7 stages, decode batch <= 5 a pipeline")
        if args.run_npu_sim:
            cols["NPU-SIM here"] = {}
            loads["NPU-SIM here"] = f"run here (commit {git_head(npu_sim)[:12]}), {args.npu_sim_requests} req"
            with tempfile.TemporaryDirectory() as tmp:
                for v in variants:
                    print(f"NPU-SIM {v[0]} GB/s {v[1]}x{v[1]}: {args.npu_sim_requests} requests ...", flush=True)
                    r = run_npu_sim(npu_sim, v, args.npu_sim_requests, Path(tmp), args.npu_sim_timeout)
                    if r is None:
                        print(f"  no result within {args.npu_sim_timeout:g} s (see run_npu_sim)", flush=True)
                        break
                    cols["NPU-SIM here"][v] = r
    runs = (("npusim A8", setup, setup.rate, setup.input_len, setup.output_len, setup.requests,
             "the A8 runner as npusim validate" + (" --quick" if args.quick else "") + " builds it: " + setup.describe()),
            ("npusim A8, DRAM on mesh", on_mesh, setup.rate, setup.input_len, setup.output_len, setup.requests,
             "the same with the per-core DRAM over the mesh (the runner before session 47)"),
            ("npusim artefact load", setup, math.inf, 100, 100, args.npusim_requests,
             f"the A8 runner with the artefact's load: {args.npusim_requests} req of 100/100 at t = 0"))
    for name, st, rate, n_in, n_out, n_req, text in runs:
        cols[name] = {}
        loads[name] = text
        for v in variants:
            print(f"{name}: {v[0]} GB/s {v[1]}x{v[1]} ...", flush=True)
            cols[name][v] = run_npusim(v, st, rate, n_in, n_out, n_req)
    areas = {v: r["area_mm2"] for v, r in cols["npusim A8"].items()}

    print("\nper variant (decode cores GB/s / array): tok/s over the makespan (the recorded results' and npusim's "
          "throughput) | tok/s over the mean latency | mean TBT ms")
    print(f"{'variant':>10} | " + " | ".join(f"{c:>28}" for c in cols))
    for v in variants:
        cells = []
        for c in cols:
            r = cols[c].get(v)
            cells.append(f"{'-':>28}" if r is None else
                         f"{r['tok_s_makespan']:9.1f} {r['tok_s_mean_latency']:9.1f} {r['tbt_ms']:8.2f}")
        print(f"{v[0]:>5}/{v[1]:<4} | " + " | ".join(cells))
    for c, d in loads.items():
        print(f"  {c}: {d}")
    print("  npusim chip area (npusim.validate.hetero.area_mm2, used for every column's per-area ratio): "
          + ", ".join(f"{v[0]}/{v[1]} {a:.0f} mm2" for v, a in areas.items()))

    print("\nA8 rows: ratios of tok/s over the makespan")
    print(f"{'row':<40} {'published':>9} | " + " | ".join(f"{c:>24}" for c in cols))
    for key, label, a, b, per_area in ROWS:
        f = study_figure(key)
        cells = []
        for c in cols:
            r = ratio(cols[c], a, b, "tok_s_makespan", per_area, areas)
            cells.append(f"{r:24.3f}" if r is not None else f"{'-':>24}")
        print(f"A8 {label:<37} {f['published']:>9} | " + " | ".join(cells))
    print(f"\nwall {time.perf_counter() - t_start:.0f} s; {machine_line()}")


if __name__ == "__main__":
    main()
