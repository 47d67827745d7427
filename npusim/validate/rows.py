"""One validation row: a published (or peer-simulated) figure beside the simulated one.

A row judges a magnitude, never only a sign. ``published`` is a number with a relation:

* ``eq``: the source states a value; ``error = simulated / published - 1`` (relative error);
* ``le`` / ``ge``: the source states a bound ("< 5% loss", "no further gain", "30%+ cut");
  ``error`` is the relative amount by which the bound is missed (0 when it holds);
* ``range``: the source states a range (``published = (lo, hi)``); error is the relative distance
  to the nearer end (0 inside);
* ``match``: a categorical figure (e.g. the best stage count); error 0 or 1.

``within_tolerance`` is ``|error| <= tolerance``. ``kind`` keeps comparisons apart:
``outside`` (a published figure not used to build the model; only these count in ``npusim
validate``'s verdict), ``fitted`` (a figure modelling choices were steered by: matching it proves
little), ``calibration`` (a figure the
preset's parameters were derived from: it matches by construction and proves only that the
calibration is applied), ``peer`` (another simulator's output), ``self`` (the project compared
with itself, e.g. its cheap against its detailed fidelity's latencies), ``timing`` (a wall-time
comparison, e.g. how much faster the cheap fidelity runs: it depends on the machine and its load,
so it is shown, never counted). ``setup`` says whether the source's
setup is known; rows with ``setup: "unknown ..."`` say what was assumed. ``baseline``: what a
naive model scores on the same row (``baseline_error``): a row the naive model passes as well
does not tell the simulator apart from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

KINDS = ("outside", "fitted", "calibration", "peer", "self", "timing")
RELATIONS = ("eq", "le", "ge", "range", "match")


@dataclass
class Row:
    name: str
    source: str
    published: float | str | tuple[float, float] | None
    simulated: float | str | None
    tolerance: float
    relation: str = "eq"
    unit: str = ""
    kind: str = "outside"
    note: str = ""
    baseline: float | None = None  # what a naive model (a roofline of the same work, a constant) gives
    family: str | None = None  # operator rows: gemm, attention, vector, collective, runtime
    half: str | None = None  # operator rows: the source's half, calibration or validation
    error: float | None = field(default=None)
    within_tolerance: bool = field(default=False)
    baseline_error: float | None = field(default=None)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"row {self.name}: kind {self.kind!r} not in {KINDS}")
        if self.relation not in RELATIONS:
            raise ValueError(f"row {self.name}: relation {self.relation!r} not in {RELATIONS}")
        if not 0 <= self.tolerance <= 0.25:
            raise ValueError(f"row {self.name}: tolerance {self.tolerance} outside [0, 0.25]")
        self.error = judge(self.relation, self.published, self.simulated)
        self.within_tolerance = self.error is not None and abs(self.error) <= self.tolerance + 1e-12
        if self.baseline is not None:
            self.baseline_error = judge(self.relation, self.published, self.baseline)

    def to_dict(self) -> dict:
        d = asdict(self)
        if isinstance(self.published, tuple):
            d["published"] = list(self.published)
        return d


def judge(relation: str, published, simulated) -> float | None:
    """The relative error of ``simulated`` against ``published`` under ``relation`` (None: the
    simulation gave no figure)."""
    if simulated is None or (isinstance(simulated, float) and not math.isfinite(simulated)):
        return None
    if relation == "match":
        return 0.0 if simulated == published else 1.0
    if relation == "range":
        lo, hi = published
        if simulated < lo:
            return simulated / lo - 1
        if simulated > hi:
            return simulated / hi - 1
        return 0.0
    if relation == "le":
        return max(0.0, simulated / published - 1)
    if relation == "ge":
        return min(0.0, simulated / published - 1)
    return simulated / published - 1


def fmt_value(v, unit: str = "", relation: str = "eq") -> str:
    if v is None:
        return "-"
    if isinstance(v, (tuple, list)):
        return f"{fmt_value(v[0])}-{fmt_value(v[1])}{unit}"
    if isinstance(v, str):
        return v
    prefix = {"le": "<= ", "ge": ">= "}.get(relation, "")
    a = abs(v)
    text = f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.3g}"
    return f"{prefix}{text}{unit}"
