"""MoE token routing and the dispatch / combine transfers of expert parallelism.

*Routing*: each of ``tokens_per_rank`` tokens on each of ``ep`` ranks picks ``top_k`` distinct
experts out of ``experts``; expert ``e`` lives on rank ``e mod ep`` (round robin, so with
``experts < ep`` some ranks hold none). Expert popularity is

* ``uniform``: every expert equally likely;
* ``zipf:S``: the expert of popularity rank ``r`` (a seeded random permutation of the experts)
  has weight ``1 / (r + 1) ** S``: ``S = 0`` is uniform, ``S >= 1`` makes a few experts hot;
* a file (YAML/JSON list, or one number per line): a load profile, one weight per expert.

A token picks its ``top_k`` experts without replacement in proportion to the weights (the
Gumbel top-k trick, seeded: deterministic).

*Dispatch* sends each token, ``bytes_per_token`` each (INT8 activations plus a 512 B scale
slot, ``hidden + 512``: 7.5 KB at hidden 7168, as the Huawei DeepSeek-V3/R1 on Ascend best-practice report and the CloudMatrix384 paper (arXiv 2506.12708) size it; or BF16, ``2 x hidden``),
as the operator's ``copies`` say:

* ``per_expert``: one copy per selected expert, so a rank holding two of a token's experts
  receives it twice. The low-latency (decode) kernels work so: DeepEP's ``low_latency_dispatch``
  fills one receive buffer per local expert (its test checks each expert's count against
  ``topk_idx == expert`` and counts bytes per selection), and CANN's MoeDistributeDispatch sizes
  a rank's receive buffer ``A >= BS x epWorldSize x min(localExpertNum, K)``;
* ``per_rank``: once to every rank holding at least one of its experts (NVIDIA DeepEP's normal,
  prefill kernels deduplicate per rank; DeepEP-Ascend's normal kernels do not: a rank receives one
  row per selected expert it holds, as sgl-kernel-npu's tests/python/deepep/test_intranode.py
  counts its bytes and notes, "todo 1. Duplicate transmission to experts of the same rank").

*Local work* of the two operators on a die, besides their transfers (:func:`dispatch_local_ops`,
:func:`combine_local_ops`; vector ops the chip simulator costs, so they scale with the tokens): the
dispatch's sender quantises its tokens (an INT8 dispatch: CANN's MoeDistributeDispatch with
``quant_mode``) and writes one row per copy into the send buffers; its receiver reorders the rows it
got into expert order for the expert GEMMs; the combine's receiver takes each token's weighted sum
of the expert outputs it got back. What the operators cost besides (launch, token counting,
synchronisation between ranks) is the system's calibrated per-call overhead.

*Combine* returns the same copies in BF16 (``2 x hidden``: 14 KB): every expert output
(``per_expert``; the weighted sum is taken on the token's own rank) or each rank's locally
summed outputs (``per_rank``). A token whose expert is on its own rank moves nothing over the
fabric.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from npusim.errors import ConfigError
from npusim.files import read_text
from npusim.model.ir import Op

SCALE_SLOT_BYTES = 512
COPIES = ("per_expert", "per_rank")
#: an expert GEMM's token rows are padded to the cube's tile, as graph-mode engines pad them
PAD_ROWS = 16


def pad_rows(tokens: int) -> int:
    """``tokens`` rounded up to a multiple of :data:`PAD_ROWS` (0 stays 0)."""
    return int(math.ceil(tokens / PAD_ROWS) * PAD_ROWS) if tokens > 0 else 0


MAX_HIDDEN = 1 << 20  # a token's width: far above any model's (its local work is costed element by element)


def _check_hidden(hidden: int) -> None:
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ConfigError(f"--hidden must be between 1 and {MAX_HIDDEN:,}, got {hidden}")


def dispatch_bytes_per_token(hidden: int, dtype: str) -> int:
    _check_hidden(hidden)
    if dtype == "int8":
        return hidden + SCALE_SLOT_BYTES
    if dtype == "bf16":
        return 2 * hidden
    raise ConfigError(f"--dtype {dtype}: dispatch carries int8 (with scales) or bf16 activations")


def combine_bytes_per_token(hidden: int) -> int:
    _check_hidden(hidden)
    return 2 * hidden


def dispatch_local_ops(tokens: int, sent_rows: int, received_rows: int, hidden: int,
                       dtype: str) -> tuple[list[Op], list[Op]]:
    """The dispatch's vector ops on one die: (sender: quantise ``tokens`` rows when the dispatch is
    INT8, then write ``sent_rows`` copies into the send buffers; receiver: reorder the
    ``received_rows`` rows into expert order), each a streaming pass over its rows, padded to
    :data:`PAD_ROWS` as graph-mode kernels are compiled for (and the expert GEMMs are)."""
    tokens, sent_rows, received_rows = pad_rows(tokens), pad_rows(sent_rows), pad_rows(received_rows)
    row_dtype = "int8" if dtype == "int8" else "bf16"
    send = []
    if dtype == "int8" and tokens > 0:
        send.append(Op("dispatch.quant", "vector", dtype="bf16", elements=tokens * hidden, op_class="quantize",
                       row_len=hidden))
    if sent_rows > 0:
        send.append(Op("dispatch.pack", "vector", dtype=row_dtype, elements=sent_rows * hidden,
                       op_class="elementwise", row_len=hidden))
    receive = [Op("dispatch.reorder", "vector", dtype=row_dtype, elements=received_rows * hidden,
                  op_class="elementwise", row_len=hidden)] if received_rows > 0 else []
    return send, receive


def combine_local_ops(received_rows: int, hidden: int) -> list[Op]:
    """The combine's vector op on one die: each token's weighted sum of the ``received_rows`` bf16
    expert outputs it got back (one multiply-add pass over them; rows padded as above)."""
    received_rows = pad_rows(received_rows)
    return [Op("combine.weighted_sum", "vector", dtype="bf16", elements=received_rows * hidden,
               op_class="elementwise", row_len=hidden)] if received_rows > 0 else []


ROUTING_FORMS = "uniform, zipf:S such as zipf:1.2, or the path of a load-profile file"


def check_routing(routing: str) -> None:
    """A ConfigError unless ``routing`` is ``uniform``, ``zipf:S`` or an existing file (checked
    before a run starts; the file's weights are checked against the model's experts when read)."""
    if routing == "uniform" or re.fullmatch(r"zipf:([0-9]*\.?[0-9]+)", routing):
        return
    if routing.lower().startswith("zipf"):
        raise ConfigError(f"--routing {routing}: zipf:S takes a non-negative exponent S, e.g. zipf:1.2")
    path = Path(routing)
    if path.is_dir():
        raise ConfigError(f"--routing {routing}: is a directory; expected {ROUTING_FORMS}")
    if not path.is_file():
        raise ConfigError(f"--routing {routing}: no such load-profile file; expected {ROUTING_FORMS}")


def expert_weights(routing: str, experts: int, seed: int = 0) -> np.ndarray:
    """Relative popularity of each expert (see module docstring)."""
    if routing == "uniform":
        return np.ones(experts)
    m = re.fullmatch(r"zipf:([0-9]*\.?[0-9]+)", routing)
    if m:
        s = float(m.group(1))
        order = np.random.default_rng(seed).permutation(experts)
        w = np.empty(experts)
        w[order] = 1.0 / np.arange(1, experts + 1) ** s
        return w
    check_routing(routing)
    return _load_profile(Path(routing), experts)


def _load_profile(path: Path, experts: int) -> np.ndarray:
    text = read_text(path, "a load profile (a list of per-expert weights)")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not a load profile ({exc.__class__.__name__}); expected a list of "
                          "per-expert weights") from None
    if isinstance(data, dict):
        data = data.get("expert_load", data.get("weights"))
    if isinstance(data, str):
        data = data.split()
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a list of {experts} per-expert weights (or a mapping with key "
                          "expert_load)")
    try:
        w = np.asarray([float(x) for x in data])
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: every per-expert weight must be a number") from None
    if w.shape[0] != experts:
        raise ConfigError(f"{path}: {w.shape[0]} weights for {experts} experts")
    if np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(f"{path}: weights must be non-negative with a positive sum")
    return w


def route_tokens(ep: int, tokens_per_rank: int, top_k: int, experts: int, weights: np.ndarray,
                 seed: int = 0, groups: int = 0, groups_per_token: int = 0, balanced: bool = False) -> np.ndarray:
    """``experts_of[rank, token, k]``: the experts each token picked (Gumbel top-k, seeded).

    Grouped experts (``groups`` equal groups of consecutive experts): a token first keeps its
    ``groups_per_token`` best groups, each scored by the sum of its two best experts' keys
    (DeepSeek-V3's group-limited routing, ``n_group`` / ``topk_group``), then picks its top-k among
    their experts; ``balanced`` (Mixture of Grouped Experts): ``top_k / groups_per_token`` from
    each kept group."""
    if top_k > experts:
        raise ConfigError(f"--top-k {top_k}: more than the {experts} experts")
    if np.count_nonzero(weights) < top_k:
        raise ConfigError(f"routing: only {np.count_nonzero(weights)} experts have load, fewer than top-k {top_k}")
    rng = np.random.default_rng(seed + 1)
    with np.errstate(divide="ignore"):
        logw = np.log(weights)
    if ep == 0 or tokens_per_rank == 0 or experts == 0:
        return _pick(np.empty((ep, tokens_per_rank, experts)), top_k, groups, groups_per_token, balanced, False)
    kernel = groups > 1 and not balanced and bool(np.all(weights > 0))
    # the keys drawn a block of ranks at a time (the generator fills an array element by element in C
    # order, so consecutive blocks are the one draw's numbers): a block stays small, picks are per token
    block = max(1, ROUTE_BLOCK_KEYS // (tokens_per_rank * experts))
    parts = []
    for r0 in range(0, ep, block):
        neg = rng.gumbel(size=(min(block, ep - r0), tokens_per_rank, experts))  # becomes -(log w + Gumbel)
        neg += logw[None, None, :]
        np.negative(neg, out=neg)
        parts.append(_pick(neg, top_k, groups, groups_per_token, balanced, kernel))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


#: keys drawn at once by :func:`route_tokens` (float64: 32 MB)
ROUTE_BLOCK_KEYS = 1 << 22


def _pick(neg: np.ndarray, top_k: int, groups: int, groups_per_token: int, balanced: bool,
          kernel: bool) -> np.ndarray:
    """Each token's ``top_k`` experts, best first, from its negated keys ``neg[rank, token, :]``."""
    if groups > 1:
        keep = groups_per_token or groups
        if kernel:  # the same choice in one Numba pass (npusim.system.routing_kernel)
            from npusim.system.routing_kernel import grouped_topk
            out = np.empty(neg.shape[:2] + (top_k,), np.int64)
            grouped_topk(neg, top_k, groups, keep, out)
            return out
        return _route_grouped(neg, top_k, groups, keep, balanced)
    if top_k == neg.shape[2]:
        return np.argsort(neg, axis=2, kind="stable")
    # the k largest keys (argpartition, linear), then in descending order: argsort's first k
    top = np.argpartition(neg, top_k - 1, axis=2)[:, :, :top_k]
    order = np.argsort(np.take_along_axis(neg, top, axis=2), axis=2, kind="stable")
    return np.take_along_axis(top, order, axis=2)


def _route_grouped(neg: np.ndarray, top_k: int, groups: int, keep: int, balanced: bool) -> np.ndarray:
    ep, ntok, experts = neg.shape
    size = experts // groups
    g = neg.reshape(ep, ntok, groups, size)  # negated keys: smaller is better
    two = min(2, size)
    best2 = np.partition(g, two - 1, axis=3)[..., :two].sum(axis=3)  # each group's two best keys
    kept = np.argsort(best2, axis=2, kind="stable")[..., :keep]  # (ep, ntok, keep) best groups
    inside = np.take_along_axis(g, kept[..., None], axis=2)  # (ep, ntok, keep, size) their keys
    if balanced:
        per = top_k // keep
        best = np.argsort(inside, axis=3, kind="stable")[..., :per]
        return (kept[..., None] * size + best).reshape(ep, ntok, keep * per)
    # the top-k among the kept groups' experts (argpartition, linear), then in descending order
    flat = inside.reshape(ep, ntok, keep * size)
    top = np.argpartition(flat, top_k - 1, axis=2)[..., :top_k]
    top = np.take_along_axis(top, np.argsort(np.take_along_axis(flat, top, axis=2), axis=2, kind="stable"), axis=2)
    return np.take_along_axis(kept, top // size, axis=2) * size + top % size


@dataclass(frozen=True)
class MoeTraffic:
    """Token counts of one dispatch: ``tokens[src, dst]`` = tokens rank ``src`` sends to ``dst``."""

    tokens: np.ndarray  # (ep, ep) token copies (as the operator's copies say); diagonal = kept local
    expert_tokens: np.ndarray  # (experts,) tokens each expert computes

    def received(self) -> np.ndarray:
        """Tokens each rank receives from other ranks."""
        off = self.tokens.copy()
        np.fill_diagonal(off, 0)
        return off.sum(axis=0)


def check_copies(copies: str) -> str:
    if copies not in COPIES:
        raise ConfigError(f"copies {copies!r}: expected one of {', '.join(COPIES)}")
    return copies


#: routed (token, expert) pairs a traffic draw holds at most, and experts at most
MAX_ROUTED_TOKENS = 10**8
MAX_EXPERTS = 10**6


def moe_traffic(ep: int, tokens_per_rank: int, top_k: int, experts: int, routing: str = "uniform",
                seed: int = 0, copies: str = "per_rank") -> MoeTraffic:
    check_copies(copies)
    for flag, value, low in (("--ep", ep, 1), ("--tokens-per-rank", tokens_per_rank, 0), ("--top-k", top_k, 1),
                             ("--experts", experts, 1)):
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    if ep * tokens_per_rank * top_k > MAX_ROUTED_TOKENS:
        raise ConfigError(f"--ep x --tokens-per-rank x --top-k = {ep * tokens_per_rank * top_k:,} routed tokens: more "
                          f"than {MAX_ROUTED_TOKENS:.0e}, each drawn and held in memory (~{MAX_ROUTED_TOKENS * 16 / 1e9:.1f} "
                          "GB at the limit)")
    if experts > MAX_EXPERTS:
        raise ConfigError(f"--experts {experts:,}: more than {MAX_EXPERTS:,} (a weight per expert is drawn)")
    picks = route_tokens(ep, tokens_per_rank, top_k, experts, expert_weights(routing, experts, seed), seed)
    rank_of = picks % ep  # expert e on rank e mod ep
    tokens = token_copies(rank_of, ep, copies)
    expert_tokens = np.bincount(picks.ravel(), minlength=experts).astype(np.int64)
    return MoeTraffic(tokens, expert_tokens)


def token_copies(dest: np.ndarray, ranks: int, copies: str) -> np.ndarray:
    """``tokens[src, dst]``: copies rank ``src`` sends to ``dst``, from ``dest[src, token, k]`` (the
    rank of each token's k-th expert): every pick (``per_expert``) or each destination once per
    token (``per_rank``)."""
    nsrc, ntok, k = dest.shape
    src = np.repeat(np.arange(nsrc), ntok * k)
    if copies == "per_expert":
        out = np.zeros((nsrc, ranks), dtype=np.int64)
        np.add.at(out, (src, dest.ravel()), 1)
        return out
    hit = np.zeros((nsrc, ntok, ranks), dtype=bool)
    hit[src, np.tile(np.repeat(np.arange(ntok), k), nsrc), dest.ravel()] = True
    return hit.sum(axis=1).astype(np.int64)
