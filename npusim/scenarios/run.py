"""A run's scenario, built once below the CLI: the model config, the request stream, the chip's mapping
or the system's plans and pools, the runtime. ``npusim run`` (a chip, ``--system``, ``--deployment``),
sweeps (:func:`run_summary`) and ``npusim plan --serving`` (through :func:`npusim.system.deploy.scenario`,
the system half of :func:`deployment_scenario`) all build theirs here and serve it; the CLI only prints
and writes files.

* :func:`chip_serving_scenario` -> :class:`ChipServing` (``npusim run`` on a chip: its mapping spec, the
  scheduler options and the requests; :meth:`ChipServing.serve` runs :func:`npusim.serving.simulate.simulate_serving`);
* :func:`system_serving_scenario` -> :class:`SystemServing` (``npusim run --system S`` with a request stream:
  the mapping's ``system_serving`` section or plan flags) and :func:`deployment_scenario` (``--deployment
  FILE``); :meth:`SystemServing.serve` runs the system's serving loop
  (:func:`npusim.system.serving.serve_pools`);
* :func:`simulate_forward_options` (one forward pass on a chip) and :func:`run_summary` (what ``npusim run
  --json`` prints for a chip, without files: a sweep point);
* :func:`system_step` (``npusim run --system S`` without a request stream: one step of a DeepSeek
  deployment file, or of any model by a parallel plan).

``opts`` everywhere is ``npusim run``'s parsed options (:func:`npusim.scenarios.options.run_parser`).
The model config is resolved once per serving scenario and passed down.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from npusim.choices import LONG_PROMPT_TOKENS
from npusim.errors import ConfigError
from npusim.files import check_output_dir
from npusim.scenarios.options import (FORWARD_DEFAULTS, PLAN_PRECISION, SERVING_DEFAULT_TP, chip_noc, chip_precision,
                                      chip_streams, fill_model_default, forward_asked, refuse_system_flags_on_a_chip,
                                      system_chip_cost)

#: the serving mapping a --system run with a request stream uses without --mapping
SERVING_MAPPINGS = {"cloudmatrix384": "cm384-deepseek-serving", "atlas-800i-a2": "a2-deepseek-serving"}
#: the plan flags of a --system run (beside --tp)
PLAN_FLAGS = ("npus", "dp", "cp", "ep", "expert_tp", "pp", "kv_dtype", "shared_tp")

Progress = Callable[..., Any] | None


# -- a chip: one forward pass, or serving ---------------------------------------------------------------

def fill_forward_defaults(args) -> None:
    """The forward-pass flags not given (--phase, --batch, --seq) at their defaults."""
    for key, value in FORWARD_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def build_model(args):
    """The operator graph the flags describe (built-in builder or ONNX import)."""
    fill_forward_defaults(args)  # --batch and --seq are positive: the parser's types say so
    if str(args.model).endswith(".onnx"):
        from npusim.model.onnx_import import load_onnx

        decode = args.phase == "decode"
        # exporters write fp32; an NPU runs the model at the chosen precision
        dtype = {"bf16": "bf16", "a8w8": "int8"}[chip_precision(args)]
        graph = load_onnx(args.model, batch=args.batch, seq_len=1 if decode else args.seq,
                          kv_len=_kv(args) + (1 if decode else 0), allow_unsupported=args.allow_unsupported,
                          dtype=dtype)
        from npusim.model.onnx_import import allowed_unsupported_notes

        for note in allowed_unsupported_notes(graph.meta):  # also in the summary's mapping.notes
            print(f"npusim run: warning: {note}", file=sys.stderr)
        return graph
    from npusim.model.builder import build_graph
    from npusim.model.zoo import get_config

    context = get_config(args.model).max_position_embeddings
    tokens = _kv(args) + 1 if args.phase == "decode" else max(_kv(args), args.seq)
    if context and tokens > context:
        raise ConfigError(f"--seq/--kv: {tokens:,} tokens in the KV cache, more than {args.model}'s context of "
                          f"{context:,} (max_position_embeddings)")
    if args.phase == "decode":  # one new token per sequence, attending to the cache and itself
        return build_graph(args.model, phase="decode", batch=args.batch, seq_len=1, kv_len=_kv(args) + 1,
                           precision=chip_precision(args), layers=args.layers)
    return build_graph(args.model, phase="prefill", batch=args.batch, seq_len=args.seq,
                       kv_len=max(_kv(args), args.seq), precision=chip_precision(args), layers=args.layers)


def _kv(args) -> int:
    """Tokens in the KV cache: ``--kv``, else ``--seq``."""
    return args.seq if args.kv is None else args.kv


def build_graph_for_spec(args):
    """A small graph of the model (one decode token) to derive a serving mapping from."""
    from npusim.model.builder import build_graph

    if str(args.model).lower().endswith(".onnx"):
        raise ConfigError(f"--model {args.model}: serving builds each iteration's graph from a model config (a "
                          "built-in name or a config.json); an ONNX graph runs one forward pass (--forward) but "
                          "cannot be served yet")

    return build_graph(args.model, phase="decode", batch=1, seq_len=1, kv_len=2, precision=chip_precision(args),
                       layers=args.layers)


def build_spec(args, arch, graph, default_tp: int = 16, base=None):
    """The mapping: ``base`` (a MappingSpec, e.g. a sweep point's), else ``--mapping``, else derived from the chip."""
    from npusim.mapping.spec import load_mapping, spec_from_flags

    if base is None:
        base = load_mapping(args.mapping) if args.mapping else None
    tp = args.tp if args.tp is not None else (None if base else min(default_tp, arch.num_cores))
    stages = args.stages
    layout = args.layout if args.layout is not None else (None if base else "ring")
    if base is None and stages is None:
        stages = max(1, min(len(graph.layers()) or 1, arch.num_cores // tp))
    spec = spec_from_flags(base, tp=tp, partition=args.partition, layout=layout, stages=stages)
    if base is None:
        spec = spec.model_copy(update={"data_parallel": 1})
    return spec


def serving_options(args, spec) -> dict:
    """The spec's ``serving:`` section with the command-line flags applied."""
    from npusim.config import validate
    from npusim.mapping.spec import Serving

    opts = spec.serving.model_dump()
    for key, flag in (("schedule", "schedule"), ("pd_layout", "pd_layout"), ("replicas", "replicas"),
                      ("budget", "budget"), ("chunk_tokens", "chunk"), ("max_batch", "max_batch"),
                      ("max_tokens", "max_tokens")):
        if getattr(args, flag, None) is not None:
            opts[key] = getattr(args, flag)
    if getattr(args, "pd_stages", None):
        opts["pd_stages"] = _pair(args.pd_stages, "--pd-stages")
    if getattr(args, "pd_layout", None) is not None and getattr(args, "replicas", None) is None:
        opts["replicas"] = None  # a layout from the command line brings its own default
    opts = validate(Serving, opts, "command-line serving options").model_dump()
    disagg = opts["schedule"] == "disagg"
    for flag in ("pd_stages", "pd_layout"):
        if getattr(args, flag, None) is not None and not disagg:
            raise ConfigError(f"--{flag.replace('_', '-')} needs --schedule disagg")
    if opts["replicas"] is None:
        opts["replicas"] = 2 if disagg and opts["pd_layout"] == "dp_first" else 1
    if opts["pd_layout"] == "pp_first" and opts["replicas"] > 1 and disagg:
        raise ConfigError("PD disaggregation over several replicas is the dp_first layout: add --pd-layout dp_first")
    return opts


def _iteration_cache(args, shared_chip: bool, reqs, context: int):
    """The iteration cache's buckets, or None (every iteration simulated): ``--iteration-cache
    on``, or ``auto`` when one instance runs on the chip (``shared_chip``: PD disaggregation or
    replicas, whose interference the cache does not see). Without ``--iteration-cache-buckets``:
    exact, or the long buckets when a prompt of ``reqs`` is longer than ``LONG_PROMPT_TOKENS``
    (exact keys then hardly repeat: every chunk of a long prompt has its own cached prefix);
    ``context``: the model's context length, which the long buckets span."""
    from npusim.serving.itercache import EXACT, long_context, parse_buckets

    text = getattr(args, "iteration_cache_buckets", None)
    mode = getattr(args, "iteration_cache", "auto")
    if mode == "off" or (mode == "auto" and shared_chip):
        why = ("" if mode == "off" else " (auto turns it off when instances share the chip, PD disaggregation "
               "or replicas, where its error is large; --iteration-cache on uses it anyway)")
        for flag in ("buckets", "dir", "replay"):
            if getattr(args, f"iteration_cache_{flag}", None) is not None:
                raise ConfigError(f"--iteration-cache-{flag} needs the iteration cache on{why}")
        return None
    if getattr(args, "iteration_cache_dir", None) is not None:
        check_output_dir(args.iteration_cache_dir, "--iteration-cache-dir")
    if text is not None:
        return parse_buckets(text, context)
    if context > 0 and max((r.input_len for r in reqs), default=0) > LONG_PROMPT_TOKENS:
        return long_context(context)
    return EXACT


def _pair(text: str, flag: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"{flag} '{text}': expected two positive integers A:B, e.g. 7:7") from None
    if a < 1 or b < 1:
        raise ConfigError(f"{flag} '{text}': both parts must be positive")
    return a, b


def pd_split(args, arch, opts: dict) -> tuple[int, int] | None:
    """``--schedule disagg`` with ``--pd-ratio P:D`` (core counts, or a ratio scaled to the chip)."""
    if opts["schedule"] != "disagg":
        if args.pd_ratio:
            raise ConfigError("--pd-ratio needs --schedule disagg")
        return None
    explicit = args.pd_ratio or (":".join(map(str, opts["pd_ratio"])) if opts["pd_ratio"] else None)
    text = explicit or "2:1"
    p, d = _pair(text, "--pd-ratio")
    if p + d <= arch.num_cores and explicit:
        return p, d
    # a ratio: as many whole multiples as fit the chip (and split evenly over the replicas)
    r = opts["replicas"]
    scale = (arch.num_cores // r // (p + d)) * r
    if scale < 1:
        raise ConfigError(f"--pd-ratio {text} needs {(p + d) * r} cores; {arch.name} has {arch.num_cores}")
    return p * scale, d * scale


@dataclass
class ChipServing:
    """``npusim run`` serving on a chip: the mapping ``spec`` (its ``serving:`` section with the flags
    applied), the scheduler and fidelity (``config``), the PD split and replicas, and the requests."""

    arch: Any
    spec: Any
    config: Any  # npusim.serving.simulate.ServingConfig
    pd: tuple[int, int] | None
    replicas: int
    source: Any  # RequestSource
    workload: Any  # Workload
    memory: str
    noc: str
    requested_cache: str
    cache_preset: str | None

    def serve(self, max_concurrency: int | None = None, progress: Progress = None):
        """Simulate the requests: (summary dict, the serving run). ``max_concurrency``: the client's
        limit on requests in flight (default: the options' --max-concurrency)."""
        from npusim.serving.simulate import simulate_serving

        if max_concurrency is None:
            max_concurrency = self.source.max_concurrency
        reqs = self.workload.requests
        run = simulate_serving(self.arch, self.spec, reqs, self.config, progress=progress, pd=self.pd,
                               replicas=self.replicas, max_concurrency=max_concurrency)
        s = run.summary
        s.update({"model": self.config.model, "arch": self.arch.name, "requests": len(reqs),
                  "lengths_clipped": self.workload.clipped, "context_clipped": self.workload.over_context,
                  "memory_fidelity": self.memory, "noc_fidelity": self.noc,
                  "memory_streams": self.config.memory_streams,
                  **self.source.client_fields(max_concurrency)})
        s["iteration_cache"]["requested"] = self.requested_cache
        if self.cache_preset is not None:
            s["iteration_cache"]["preset"] = self.cache_preset
        return s, run


def chip_serving_scenario(opts, arch, base=None) -> ChipServing:
    """The chip serving scenario of ``opts`` on ``arch`` (``base``: a MappingSpec replacing --mapping)."""
    from npusim.model.zoo import get_config
    from npusim.serving.itercache import preset_name
    from npusim.serving.scheduler import SchedulerConfig
    from npusim.serving.simulate import ServingConfig
    from npusim.serving.workload import RequestSource

    spec = build_spec(opts, arch, build_graph_for_spec(opts), default_tp=SERVING_DEFAULT_TP, base=base)
    sopts = serving_options(opts, spec)
    spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pd_stages": sopts["pd_stages"]})})
    pd = pd_split(opts, arch, sopts)
    source = RequestSource.from_options(opts)
    cfg = get_config(opts.model)
    workload = source.requests_for(cfg)
    context = cfg.max_position_embeddings
    sched = SchedulerConfig(policy="continuous" if pd else sopts["schedule"], max_batch=sopts["max_batch"],
                            max_tokens=sopts["max_tokens"], chunk_tokens=sopts["chunk_tokens"], budget=sopts["budget"])
    cache = _iteration_cache(opts, pd is not None or sopts["replicas"] > 1, workload.requests, context)
    config = ServingConfig(model=opts.model, precision=chip_precision(opts), layers=opts.layers, scheduler=sched,
                           memory_mode=opts.memory, noc_mode=chip_noc(opts), **chip_streams(opts),
                           admission=opts.admission,
                           prefix_cache=opts.prefix_cache, slo_ttft_ms=opts.slo_ttft_ms, slo_tbt_ms=opts.slo_tbt_ms,
                           slo_tpot_ms=getattr(opts, "slo_tpot_ms", None), iteration_cache=cache,
                           iteration_cache_dir=getattr(opts, "iteration_cache_dir", None),
                           iteration_replay=getattr(opts, "iteration_cache_replay", None) or "stages")
    return ChipServing(arch, spec, config, pd, sopts["replicas"], source, workload, opts.memory, chip_noc(opts),
                       getattr(opts, "iteration_cache", "auto"),
                       None if cache is None else preset_name(cache, context))


def simulate_forward_options(opts, arch, base=None, progress: Progress = None):
    """The forward pass the options describe, simulated on ``arch`` (mapping ``base`` if given)."""
    from npusim.scenarios.forward import simulate_forward

    graph = build_model(opts)
    spec = build_spec(opts, arch, graph, base=base)
    return simulate_forward(graph, arch, spec, memory_mode=opts.memory, noc_mode=chip_noc(opts),
                            progress=progress, **chip_streams(opts))


def run_summary(opts, arch, base=None) -> dict:
    """What ``npusim run --json`` prints for parsed options on a loaded chip, without writing files or
    printing: the run path that sweeps (``npusim.sweep``) call for each point. ``base`` is a
    MappingSpec that replaces ``--mapping``."""
    fill_model_default(opts)
    refuse_system_flags_on_a_chip(opts)
    if not forward_asked(opts):
        return chip_serving_scenario(opts, arch, base).serve()[0]
    return simulate_forward_options(opts, arch, base).summary


# -- a system: serving by a mapping's system_serving section, plan flags, or a deployment file ---------------

@dataclass
class SystemServing:
    """``npusim run --system S`` (or ``--deployment FILE``) with a request stream: the loaded system, the
    model config, the pools of instances (:class:`npusim.system.serving.PoolSpec`), the KV fabric, the
    objectives, the runtime and the requests; :meth:`serve` runs the system serving loop."""

    loaded: Any
    cfg: Any  # ModelConfig
    pools: list
    source: Any  # RequestSource
    workload: Any  # Workload
    chip_cost: Any  # one for every run of a sweep: its step costs are reused
    kv_fabric: str | None = None
    via: str = "sdma"
    pool_config: Any = None  # KVPoolConfig of the mapping's system_serving section (None: no caching pool)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_tbt_ms: float | None = None
    runtime: str | None = None
    seed: int = 0
    label: dict = field(default_factory=dict)  # {"mapping": ...} or {"deployment": ...}: where it came from
    deployment: Any = None  # the ServingDeployment, if from a file

    def serve(self, max_concurrency: int | None = None, progress: Progress = None):
        """Serve the requests (closed loop at ``max_concurrency`` if given): the SystemServingResult,
        its summary carrying the client's settings."""
        from npusim.system.serving import serve_pools

        run = serve_pools(self.loaded, self.pools, self.workload.requests, self.cfg, kv_fabric=self.kv_fabric,
                          via=self.via, caching_pool=self.pool_config, slo_ttft_ms=self.slo_ttft_ms,
                          slo_tpot_ms=self.slo_tpot_ms, slo_tbt_ms=self.slo_tbt_ms, seed=self.seed,
                          progress=progress, chip_cost=self.chip_cost, max_concurrency=max_concurrency,
                          runtime=self.runtime)
        run.summary.update(self.source.client_fields(max_concurrency))
        return run


def system_serving_scenario(opts) -> SystemServing:
    """``npusim run --system S`` with a request stream: the mapping's ``system_serving:`` section (default
    ``mappers/<system>-deepseek-serving.yaml``) names a prefill and a decode instance; plan flags (or a
    model that is not a MoE with MLA) make each instance a parallel plan over the file's ``plan:`` keys."""
    from npusim.mapping.deployment import Deployment
    from npusim.mapping.spec import load_system_serving
    from npusim.model.zoo import get_config
    from npusim.serving.workload import RequestSource
    from npusim.system.load import load_system
    from npusim.system.serving import system_serving_pools

    loaded = load_system(opts.system, nodes=opts.nodes)
    mapping = opts.mapping or SERVING_MAPPINGS.get(loaded.system.name)
    if mapping is None:
        raise ConfigError(f"--system {opts.system} with a request stream needs --mapping with a system_serving "
                          "section (e.g. mappers/cm384-deepseek-serving.yaml)")
    plan, pdep, ddep = load_system_serving(mapping)
    cfg = get_config(opts.model)
    plan_flags = any(getattr(opts, k, None) is not None for k in (*PLAN_FLAGS, "tp"))
    if plan_flags or not (cfg.is_mla and cfg.num_experts) or not isinstance(ddep, Deployment):
        # any model: each instance by a parallel plan (the file's plan: sections, flags over them; a
        # DeepSeek deployment file's instances take the default plan over one node)
        pdep, ddep = (plan_from_args(opts, loaded, cfg, {} if isinstance(d, Deployment) else d.plan_keys())
                      for d in (pdep, ddep))
    for d in (pdep, ddep):
        if (d.cp or 1) > 1:
            raise ConfigError(f"cp {d.cp}: context parallelism is simulated for one prefill step (npusim run --system "
                              "... --phase prefill); a serving run's instances hold their sequences on groups of tp "
                              "dies, and its prompts take any length: serve with cp 1")
    updates = {}
    if opts.prefill_instances is not None:  # positive, as are the SLOs: the parser's types say so
        updates["prefill"] = plan.prefill.model_copy(update={"instances": opts.prefill_instances})
    for key, value in (("slo_ttft_ms", opts.slo_ttft_ms), ("slo_tpot_ms", opts.slo_tpot_ms)):
        if value is not None:
            updates[key] = value
    plan = plan.model_copy(update=updates)
    source = RequestSource.from_options(opts)
    workload = source.requests_for(cfg)
    if not workload.requests:
        raise ConfigError("no requests to serve (check --trace, --duration or --requests)")
    caching_pool = None if opts.caching_pool is None else opts.caching_pool == "on"
    pools, pool_config, kv_fabric, via = system_serving_pools(plan, pdep, ddep, opts.kv_fabric, caching_pool,
                                                              opts.mtp, opts.mtp_acceptance)
    return SystemServing(loaded, cfg, pools, source, workload, system_chip_cost(opts, loaded), kv_fabric, via,
                         pool_config, plan.slo_ttft_ms, plan.slo_tpot_ms, opts.slo_tbt_ms, opts.runtime, opts.seed,
                         {"mapping": str(mapping)})


def deployment_scenario(opts, dep, where: str) -> SystemServing:
    """``npusim run --deployment FILE``: a deployment file's pools (:func:`npusim.system.deploy.scenario`,
    what ``npusim plan --serving`` serves its candidates by) with the options' requests; the file's
    runtime unless ``--runtime`` overrides it."""
    from npusim.model.zoo import get_config
    from npusim.serving.workload import RequestSource
    from npusim.system.deploy import scenario

    loaded, pools = scenario(dep, where)
    cfg = get_config(dep.model)
    source = RequestSource.from_options(opts)
    workload = source.requests_for(cfg)
    if not workload.requests:
        raise ConfigError("no requests to serve (check --trace, --duration or --num-prompts)")
    kv = dep.kv_transfer
    return SystemServing(loaded, cfg, pools, source, workload, system_chip_cost(opts, loaded),
                         opts.kv_fabric or (kv.fabric if kv else None), kv.via if kv else "sdma", None,
                         opts.slo_ttft_ms or dep.slo_ttft_ms, opts.slo_tpot_ms or dep.slo_tpot_ms, opts.slo_tbt_ms,
                         getattr(opts, "runtime", None) or dep.runtime, opts.seed, {"deployment": where}, dep)



def plan_from_args(args, loaded, cfg, base: dict | None = None):
    """The plan the flags give over the mapping file's ``plan:`` section (``base``), the rest
    filled by :func:`npusim.system.plan.default_plan`; the instance defaults to one node, or to the
    fewest whole nodes that hold the model's weights (:func:`npusim.system.step.default_npus`)."""
    from npusim.system.plan import default_plan
    from npusim.system.step import default_npus

    keys = ("npus", "tp", "dp", "cp", "ep", "expert_tp", "pp", "microbatches", "kv_dtype", "mtp", "mtp_acceptance",
            "shared_tp")
    given = {k: v for k, v in (base or {}).items() if v is not None}
    given.update({k: getattr(args, k) for k in keys if getattr(args, k, None) is not None})
    if args.precision is not None or "precision" not in given:
        given["precision"] = PLAN_PRECISION[args.precision or "bf16"]
    npus = given.pop("npus", None) or default_npus(loaded, cfg, given)
    return default_plan(cfg, npus, loaded.system.npu.dies, **given)


# -- a system: one step ---------------------------------------------------------------------------------

PLAN_DEFAULT_BATCH = {"decode": 16, "prefill": 4}
PLAN_DEFAULT_TOKENS = 1024  # decode context (--kv) and prefill prompt (--seq)


def system_kv(args, phase: str, default: int) -> int | None:
    """A --system step's decode context: ``--kv``, else ``--seq`` (as on a chip: the tokens already
    cached), else ``default``; at least 1 (the system's step shape counts the new token in its
    context, so ``--kv 1`` is an empty cache; 0 would be a step that attends to nothing). A prefill
    step's prompts start from an empty cache: ``--kv`` (a cached prefix) is refused, not ignored."""
    if phase != "decode":
        if args.kv is not None:
            raise ConfigError(f"--kv {args.kv}: a --system prefill step's prompts (--seq) start from an empty cache; "
                              "a cached prefix is not modelled there: drop --kv")
        return None
    kv = args.kv if args.kv is not None else args.seq if args.seq is not None else default
    if kv < 1:
        raise ConfigError(f"--kv {kv}: a --system decode step attends to a context of at least one token, the new "
                          "one (--kv 1: an empty cache)")
    return kv


def shape_from_args(args):
    """The plan path's step shape: --phase (default decode), --batch (16 decode, 4 prefill), the decode
    context (:func:`system_kv`) or the prefill prompt (--seq, default 1,024)."""
    from npusim.system.mapper import StepShape

    phase = args.phase or "decode"
    batch = args.batch or PLAN_DEFAULT_BATCH[phase]
    if phase == "decode":
        return StepShape("decode", batch, 1, system_kv(args, phase, PLAN_DEFAULT_TOKENS))
    system_kv(args, phase, PLAN_DEFAULT_TOKENS)
    seq = args.seq or PLAN_DEFAULT_TOKENS
    return StepShape("prefill", batch, seq, seq)


def system_step(opts):
    """One step of ``npusim run --system S``: ``("deployment", StepResult)`` for a DeepSeek deployment file
    (``--mapping`` whose ``plan:`` section names its ``phase``; the system's calibrated constants and the
    published reports' figures, :func:`npusim.system.moe_step.simulate_step`), else ``("plan", (summary,
    workload, timing))`` by a parallel plan (:func:`plan_step`). Both build the step with the one system
    mapper."""
    from npusim.mapping.spec import load_deployment, load_mapping
    from npusim.system.load import load_system
    from npusim.system.moe import check_routing
    from npusim.system.moe_step import simulate_step

    check_routing(opts.routing)
    spec = None if opts.mapping is None else load_mapping(opts.mapping)
    if spec is not None and spec.plan is None:
        raise ConfigError(f"--mapping {opts.mapping}: no 'plan:' section for --system (see "
                          "mappers/a2-llama3-70b-tp8.yaml or mappers/cm384-deepseek-decode.yaml)")
    if spec is None or spec.plan.phase is None:
        return "plan", plan_step(opts, spec.plan.plan_keys() if spec is not None else {})
    loaded = load_system(opts.system, nodes=opts.nodes)
    flags = {k: getattr(opts, k, None) for k in (*PLAN_FLAGS, "tp")}
    if opts.precision is not None:
        flags["precision"] = PLAN_PRECISION[opts.precision]
    dep = load_deployment(opts.mapping).overridden(**flags)
    phase = opts.phase or dep.phase
    if phase != dep.phase:
        raise ConfigError(f"--phase {phase}, but {opts.mapping} deploys the model for {dep.phase}")
    return "deployment", simulate_step(loaded, dep, model=opts.model, batch=opts.batch,
                                       kv=system_kv(opts, phase, 4096) or 4096, batch_tokens=opts.batch_tokens,
                                       seq=opts.seq or 4096, mtp=opts.mtp, mtp_acceptance=opts.mtp_acceptance,
                                       microbatches=opts.microbatches, eplb=opts.eplb, routing=opts.routing,
                                       kv_min=opts.kv_min, chip_cost=system_chip_cost(opts, loaded),
                                       runtime=opts.runtime)


def plan_step(opts, base: dict | None = None):
    """One step of any model by a parallel plan (a mapping file's ``plan:`` section ``base``, flags over
    it; defaults in :func:`plan_from_args`): (summary, workload, timing) of
    :func:`npusim.system.step.simulate_plan_step`."""
    from npusim.model.zoo import get_config
    from npusim.system.load import load_system
    from npusim.system.plan import ParallelPlan
    from npusim.system.step import simulate_plan_step

    for flag in ("batch_tokens", "kv_min", "eplb"):
        if getattr(opts, flag, None) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')}: taken by the DeepSeek deployment files only (--mapping "
                              "mappers/cm384-deepseek-*.yaml); the plan path does not model it yet")
    loaded = load_system(opts.system, nodes=opts.nodes)
    if str(opts.model).endswith(".onnx"):  # data parallel over the instance's dies (the export has no heads to split)
        refused = [f"--{k.replace('_', '-')}" for k in ("microbatches", "kv_dtype", "mtp", "shared_tp", "cp",
                                                         "expert_tp")
                   if getattr(opts, k, None) not in (None, 0, 1) or (k == "kv_dtype" and opts.kv_dtype)]
        if refused or base:
            raise ConfigError(f"{opts.model}: an ONNX export runs data parallel over the instance's dies (--npus, "
                              f"--precision); {', '.join(refused) or 'a mapping plan'} cannot be applied to it")
        dies = loaded.system.npu.dies
        npus = opts.npus or loaded.system.npus_per_node
        plan = ParallelPlan(npus=npus, tp=opts.tp or 1, dp=opts.dp or npus * dies, ep=opts.ep or 1, pp=opts.pp or 1,
                            microbatches=1, precision=PLAN_PRECISION[opts.precision or "bf16"])
        cfg = opts.model
    else:
        cfg = get_config(opts.model)
        plan = plan_from_args(opts, loaded, cfg, base)
    out, wl, timing = simulate_plan_step(loaded, cfg, plan, shape_from_args(opts), routing=opts.routing,
                                         seed=opts.seed, chip_cost=system_chip_cost(opts, loaded), runtime=opts.runtime)
    per_node = loaded.system.npus_per_node
    if not (opts.npus or (base or {}).get("npus")) and plan.npus > per_node:
        out["note"] = (f"instance: {plan.npus // per_node} nodes ({plan.npus} NPUs), the fewest that hold "
                       f"{out['model']}'s {plan.precision} weights by the default plan (--npus to choose); {out['note']}")
    return out, wl, timing
