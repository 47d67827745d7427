"""``npusim run --system S``: one decode or prefill step of a MoE model deployed over many NPUs.

The mapping spec's ``system:`` section (``mappers/cm384-deepseek-decode.yaml`` ...) says how the model
is laid over the instance's NPUs; the flags override its choices. Each die's compute is timed by the
chip simulator (memoised chip costs), dispatch and combine by the fabric model.
"""

from __future__ import annotations

import json

from npusim.errors import ConfigError
from npusim.files import write_json


def add_system_run_args(p) -> None:
    g = p.add_argument_group("multi-NPU step (--system)")
    g.add_argument("--system", default=None, help="system preset or file (cloudmatrix384, atlas-800i-a2): simulate "
                   "one step of a MoE model deployed by --mapping's system section")
    g.add_argument("--nodes", type=int, default=None, help="use the first N nodes of the system")
    g.add_argument("--batch-tokens", type=int, default=None, help="prefill: prompt tokens per NPU in the step")
    g.add_argument("--mtp", type=int, default=None, help="speculative (MTP) tokens per step (default: the mapping's, 0)")
    g.add_argument("--mtp-acceptance", type=float, default=None, help="MTP acceptance rate (default 0.7)")
    g.add_argument("--microbatches", type=int, choices=[1, 2], default=None, help="default: the mapping's")
    g.add_argument("--eplb", choices=["none", "greedy", "perfect"], default=None, help="expert placement by load")
    g.add_argument("--routing", default="uniform", help="expert popularity: uniform, zipf:S or a load-profile file")


def run_system_step(args) -> int:
    from npusim.mapping.spec import load_deployment
    from npusim.system.load import load_system
    from npusim.system.moe_step import simulate_step

    if args.mapping is None:
        raise ConfigError("--system needs --mapping with a system section (e.g. mappers/cm384-deepseek-decode.yaml)")
    loaded = load_system(args.system, nodes=args.nodes)
    dep = load_deployment(args.mapping)
    phase = args.phase or dep.phase
    if phase != dep.phase:
        raise ConfigError(f"--phase {phase}, but {args.mapping} deploys the model for {dep.phase}")
    model = args.model if args.model != "qwen3-4b" else "deepseek-r1"
    r = simulate_step(loaded, dep, model=model, batch=args.batch, kv=args.kv or 4096, batch_tokens=args.batch_tokens,
                      seq=args.seq or 4096, mtp=args.mtp, mtp_acceptance=args.mtp_acceptance,
                      microbatches=args.microbatches, eplb=args.eplb, routing=args.routing)
    out = r.to_dict()
    if args.out:
        write_json(args.out / "summary.json", out)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{r.model} {r.phase} on {r.system}: {r.npus} NPUs = {r.dies} dies, {r.batch_per_npu:g} per NPU "
          f"({r.batch_per_die:g} per die), {r.microbatches} microbatch(es), MTP {r.mtp} at {r.mtp_acceptance:g}")
    print(f"  step          {r.step_ms:,.2f} ms ({r.tokens_per_step:g} tokens per sequence)")
    if r.phase == "decode":
        print(f"  TPOT          {r.tpot_ms:,.2f} ms")
    print(f"  throughput    {r.tokens_per_s_per_npu:,.0f} tokens/s per NPU")
    print(f"  MoE layer     {r.layer_us:,.1f} us: " + ", ".join(f"{k} {v:,.1f}" for k, v in r.breakdown_us.items()))
    print(f"  memory        {r.kv_gb_per_die:.1f} GB KV + {r.weights_gb_per_die:.1f} GB weights per die; "
          f"expert load imbalance {r.imbalance:.2f}")
    print(f"  note          {r.note}")
    return 0
