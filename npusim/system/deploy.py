"""A serving deployment file (``deployment.yaml``, what ``npusim plan --serving --out DIR`` writes and
``npusim run --deployment FILE`` serves): a model on a system, in pools of instances, each instance a
parallel plan, with its batch limits; the SLOs it was chosen for; and the plan search's estimate.

    deployment:
      model: qwen3-30b-a3b
      system: atlas-800i-a2
      nodes: null                  # optional: --nodes of the system
      mode: aggregated             # or disaggregated
      pools:
        - role: aggregated         # aggregated, or prefill and decode
          instances: 2
          plan: {npus: 8, tp: 4, dp: 2, ep: 8, ...}   # npusim.system.plan.ParallelPlan keys
          max_batch_per_npu: 16    # sequences per NPU (aggregated, decode)
          tokens_per_npu: 1024     # tokens per NPU an iteration (prefill's batch, aggregated's budget)
          chunk_tokens: 512        # aggregated: prompt chunk (0: whole prompts)
      kv_transfer: {fabric: roce, via: sdma}   # disaggregated
      slo_ttft_ms: 2000
      slo_tpot_ms: 50
      runtime: graph               # optional: eager / graph for every step (default: the system's per phase)
      estimate: {...}              # optional, informational: the search's step estimate

:func:`scenario` turns a file into what the serving loop (:func:`npusim.system.serving.serve_pools`)
takes; the CLI and the serving plan search both call it. Units in key names (``_ms``, ``_per_npu``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from npusim.config import StrictModel, load_yaml, validate
from npusim.errors import ConfigError
from npusim.mapping.deployment import KVTransfer


class PoolEntry(StrictModel):
    """One pool: ``instances`` copies of ``plan`` (every ParallelPlan key, ``npus`` per instance)."""

    role: Literal["aggregated", "prefill", "decode"]
    instances: PositiveInt = 1
    plan: dict[str, Any]
    max_batch_per_npu: PositiveInt = 64
    tokens_per_npu: PositiveInt = 16384
    chunk_tokens: NonNegativeInt = 0


class ServingDeployment(StrictModel):
    """A deployment (see the module docstring)."""

    model: str
    system: str
    nodes: PositiveInt | None = None
    mode: Literal["aggregated", "disaggregated"]
    pools: list[PoolEntry] = Field(min_length=1)
    kv_transfer: KVTransfer | None = None
    slo_ttft_ms: float | None = Field(default=None, gt=0)
    slo_tpot_ms: float | None = Field(default=None, gt=0)
    runtime: Literal["eager", "graph"] | None = None
    estimate: dict[str, Any] | None = None


class _File(StrictModel):
    deployment: ServingDeployment


def load_serving_deployment(path: str | Path) -> ServingDeployment:
    """Read and check a deployment file (one ConfigError naming the file and key otherwise)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--deployment {path}: no such file (write one with npusim plan --serving --out DIR)")
    dep = validate(_File, load_yaml(p), p).deployment
    roles = sorted(e.role for e in dep.pools)
    want = ["aggregated"] if dep.mode == "aggregated" else ["decode", "prefill"]
    if roles != want:
        raise ConfigError(f"{p}: deployment.pools: mode {dep.mode} takes pools {' and '.join(want)}, got "
                          f"{', '.join(roles)}")
    if dep.mode == "disaggregated" and dep.kv_transfer is None:
        raise ConfigError(f"{p}: deployment.kv_transfer: a disaggregated deployment names the fabric its KV moves "
                          "over (e.g. {fabric: roce, via: sdma})")
    return dep


def write_serving_deployment(path: Path, dep: ServingDeployment) -> None:
    import yaml

    from npusim.files import atomic_path

    text = ("# written by npusim plan --serving; serve it again with npusim run --deployment FILE\n"
            + yaml.safe_dump({"deployment": dep.model_dump(mode="json")}, sort_keys=False))
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def scenario(dep: ServingDeployment, where: str = "deployment", loaded=None):
    """(the loaded system, the pools) of a deployment: what :func:`npusim.system.serving.serve_pools` takes
    (``loaded``: the system already loaded, else loaded here)."""
    from npusim.model.zoo import get_config
    from npusim.system.load import load_system
    from npusim.system.plan import ParallelPlan, check_plan
    from npusim.system.serving import PoolSpec

    loaded = loaded or load_system(dep.system, nodes=dep.nodes)
    cfg = get_config(dep.model)
    pools = []
    for i, e in enumerate(dep.pools):
        plan = ParallelPlan.from_dict(e.plan, where=f"{where}.pools[{i}].plan")
        check_plan(plan, cfg, loaded.system.npu.dies, loaded.system.num_npus)
        pools.append(PoolSpec(e.role, e.instances, plan, max_batch_per_npu=e.max_batch_per_npu,
                              tokens_per_npu=e.tokens_per_npu, chunk_tokens=e.chunk_tokens))
    return loaded, pools
