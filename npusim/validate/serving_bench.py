"""Published serving benchmarks on Ascend (``published.yaml`` ``serving_benchmarks``: what ``vllm bench
serve`` printed for a model on Atlas A2 cards, with its stated lengths, prompts, request rate and, for a
closed loop, maximum concurrency) against npusim's system serving loop driven by the same benchmark client.

Each source names its ``publisher`` (the project or team that measured and published the figures: the
vLLM-Ascend project's own pages, GPUStack's Performance Lab runs of vLLM-Ascend), and every row's source
starts with it, so the group's spread over publishers is visible.

Each case is served as ``npusim run --deployment FILE --dataset random --input-len I --output-len O
--num-prompts N --request-rate R [--max-concurrency C]`` would serve it: one aggregated instance of the
case's plan on Atlas 800I A2 (:func:`npusim.scenarios.run.deployment_scenario`, the CLI's own path), 256
sequences and 2,048 tokens an iteration over the instance (vLLM's defaults; a prompt is split where an
iteration's token budget ends, as vLLM's chunked prefill splits it), the presets' runtime. A row per
published mean (TTFT, TPOT), kind ``outside``: the figures were recorded before any was simulated and no
model change follows from them -- except where a case's ``steered`` says which fix its errors exposed
(its rows are then ``fitted``: they were looked at before that change).

The naive baseline beside each row is a roofline (:func:`npusim.validate.plans.roofline_ms`: the step's
FLOPs at the cards' peak or its weight and KV bytes at their HBM bandwidth, whichever is slower, nothing
else): TTFT = one prefill step of the prompts that arrive together (all of them at request rate inf, at
most the maximum concurrency, else one) that fit one iteration's 2,048 tokens (at least one whole prompt),
TPOT = one decode step of as many sequences as arrive together (at most vLLM's 256) at the mean context
(prompt + half the output). Units: ms. ``quick`` serves at most 50 prompts of a case
(its note says so).
"""

from __future__ import annotations

import math

from npusim.validate.published import published
from npusim.validate.rows import Row

TOLERANCE = 0.25
MAX_SEQS, BATCHED_TOKENS = 256, 2048  # vLLM's defaults (max-num-seqs, max-num-batched-tokens)
QUICK_PROMPTS = 50
METRICS = (("ttft_ms", "mean TTFT"), ("tpot_ms", "mean TPOT"))


def _deployment(case: dict):
    from npusim.system.deploy import ServingDeployment

    npus = case["plan"]["npus"]
    return ServingDeployment(model=case["model"], system=case["system"], mode="aggregated", pools=[{
        "role": "aggregated", "instances": 1, "plan": case["plan"], "max_batch_per_npu": MAX_SEQS // npus,
        "tokens_per_npu": BATCHED_TOKENS // npus, "chunk_tokens": 0}])


def _client_argv(case: dict, prompts: int) -> list[str]:
    c = case["client"]
    closed = ["--max-concurrency", str(c["max_concurrency"])] if c.get("max_concurrency") else []
    return ["--dataset", c["dataset"], "--input-len", str(c["input_len"]), "--output-len", str(c["output_len"]),
            "--num-prompts", str(prompts), "--request-rate", str(c["request_rate"]), *closed, "--no-progress",
            "--json"]


def serve_case(case: dict, prompts: int) -> dict:
    """The serving summary of a case (its client at ``prompts`` prompts)."""
    from npusim.scenarios.options import run_parser
    from npusim.scenarios.run import deployment_scenario

    opts = run_parser().parse_args(_client_argv(case, prompts))
    return deployment_scenario(opts, _deployment(case), f"published.yaml serving_benchmarks {case['id']}").serve(
        opts.max_concurrency).summary


def baselines(case: dict, loaded) -> dict:
    """The naive roofline TTFT and TPOT of a case (see the module docstring)."""
    from npusim.system.mapper import StepShape
    from npusim.system.plan import ParallelPlan
    from npusim.validate.plans import roofline_ms

    c = case["client"]
    together = min(c["num_prompts"], c.get("max_concurrency") or c["num_prompts"]) \
        if math.isinf(float(c["request_rate"])) else 1
    first = min(together, max(1, BATCHED_TOKENS // c["input_len"]))  # whole prompts within one iteration's budget
    plan = ParallelPlan.from_dict(case["plan"])
    ctx = c["input_len"] + c["output_len"] // 2
    return {"ttft_ms": roofline_ms(loaded, case["model"], plan, StepShape("prefill", first, c["input_len"],
                                                                          c["input_len"])),
            "tpot_ms": roofline_ms(loaded, case["model"], plan, StepShape("decode", min(together, MAX_SEQS), 1,
                                                                          ctx))}


def serving_rows(quick: bool = False) -> list[Row]:
    from npusim.model.zoo import get_config
    from npusim.system.load import load_system

    sec = published()["serving_benchmarks"]
    rows = []
    for case in sec["cases"]:
        src = sec["sources"][case["source"]]
        c = case["client"]
        prompts = min(c["num_prompts"], QUICK_PROMPTS) if quick else c["num_prompts"]
        served = serve_case(case, prompts)
        base = baselines(case, load_system(case["system"]))
        open_rate = "" if math.isinf(float(c["request_rate"])) else f"{c['request_rate']:g}/s"
        rate = (f"{open_rate} at concurrency {c['max_concurrency']}".lstrip() if c.get("max_concurrency")
                else open_rate or "all at once")  # a closed loop keeps max_concurrency requests in flight
        what = (f"{get_config(case['model']).name} on {case['plan']['npus']} {case['system']} NPU"
                f"{'s' if case['plan']['npus'] > 1 else ''} (tp {case['plan']['tp']}), {c['input_len']} -> "
                f"{c['output_len']} tokens, {c['num_prompts']} prompts {rate}")
        steered = case.get("steered")  # the fix a case's errors exposed: its rows were seen before it
        kind = "fitted" if steered else "outside"
        note = (f"{f'fitted ({steered})' if steered else 'outside'}; setup: {case['setup']}"
                + (f"; quick: {prompts} of the {c['num_prompts']} prompts served" if prompts < c["num_prompts"]
                   else ""))
        for key, label in METRICS:
            rows.append(Row(name=f"{label}: {what}", source=f"{src['publisher']}: {src['url']} ({src['hardware']})",
                            published=float(case["measured"][key]), simulated=(served.get(key) or {}).get("mean"),
                            tolerance=TOLERANCE, unit=" ms", kind=kind, baseline=base[key], note=note))
    return rows
