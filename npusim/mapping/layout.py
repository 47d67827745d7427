"""Where each tensor-parallel group sits on the mesh, and its cores' ring order.

Groups are numbered replica-major (``group = replica * stages + stage``) and packed in
that order, so the stages of one replica are neighbours. Shapes:

* ``linear_seq`` / ``linear_interleave``: ``t`` consecutive cores along a snake
  (boustrophedon) path through the rows — even rows west to east, odd rows east to west
  (8x8: 0..7, then 15..8, 16..23, ...); ``layout.origin`` names the strip's first core *on
  that path*, so a strip on an odd row starts at its eastmost core (cores 56-59 of an 8x8
  mesh: origin 59), and a strip may wrap onto the next row; ring order along the strip
  (``linear_seq``: the last core closes the ring back across the strip) or out on even
  and back on odd positions (``linear_interleave``: every ring hop <= 2 mesh hops).
* ``ring`` / ``mesh2d``: an ``r x c`` block (``r * c = t``, as square as the grid allows);
  ``ring`` orders the block as a Hamiltonian cycle where one exists (every hop 1),
  ``mesh2d`` in snake order, its rows and columns being the ``tp_mnk`` grid axes.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.hw.noc.routing import grid_hops
from npusim.errors import ConfigError


@dataclass(frozen=True)
class Group:
    replica: int
    stage: int
    cores: tuple[int, ...]  # ring order
    shape: tuple[int, int]  # rows x cols of the block (1 x t for strips)


def _snake(w: int, h: int) -> list[tuple[int, int]]:
    return [(x if y % 2 == 0 else w - 1 - x, y) for y in range(h) for x in range(w)]


def _block_shape(t: int, w: int, h: int) -> tuple[int, int]:
    best = None
    for r in range(1, t + 1):
        if t % r:
            continue
        c = t // r
        if r <= h and c <= w and (best is None or abs(r - c) < abs(best[0] - best[1])):
            best = (r, c)
    if best is None:
        raise ConfigError(f"a TP group of {t} cores does not fit a block of the {w}x{h} mesh")
    return best


def _cycle(r: int, c: int) -> list[tuple[int, int]]:
    """A Hamiltonian cycle through an r x c block (offsets), or snake order if none exists."""
    if r == 1 or c == 1:
        return [(x, y) for y in range(r) for x in range(c)]
    if r % 2 == 1 and c % 2 == 1:
        return [(x if y % 2 == 0 else c - 1 - x, y) for y in range(r) for x in range(c)]
    if r % 2 == 1:  # make the number of rows even by walking columns instead
        return [(x, y) for (y, x) in _cycle(c, r)]
    path = [(x, 0) for x in range(c)]
    for y in range(1, r):
        xs = range(c - 1, 0, -1) if y % 2 == 1 else range(1, c)
        path += [(x, y) for x in xs]
    path += [(0, y) for y in range(r - 1, 0, -1)]
    return path


def _interleave(order: list[int]) -> list[int]:
    return order[0::2] + order[1::2][::-1]


def place_groups(width: int, height: int, tp: int, stages: int, replicas: int, kind: str,
                 origins: list[int] | None = None) -> list[Group]:
    n = width * height
    need = tp * stages * replicas
    if need > n:
        raise ConfigError(f"{replicas} replica(s) x {stages} stage(s) x TP {tp} = {need} cores, "
                          f"but the chip has {n}")
    count = stages * replicas
    groups = []
    if kind in ("linear_seq", "linear_interleave"):
        path = [y * width + x for x, y in _snake(width, height)]
        starts = [path.index(o) if 0 <= o < n else n for o in origins] if origins else [g * tp for g in range(count)]
        for g, i in enumerate(starts[:count]):
            if i + tp > n:
                valid = sorted(path[:n - tp + 1])
                raise ConfigError(f"layout.origin {origins[g] if origins else i}: a strip of {tp} cores does not fit "
                                  f"there (strips run along the snake path: even rows west to east, odd rows east "
                                  f"to west; valid origins for {tp} cores on the {width}x{height} mesh: "
                                  f"{_ranges(valid)})")
            cores = path[i:i + tp]
            if kind == "linear_interleave":
                cores = _interleave(cores)
            groups.append(Group(g // stages, g % stages, tuple(cores), (1, tp)))
    elif kind in ("ring", "mesh2d"):
        r, c = _block_shape(tp, width, height)
        per_row = width // c
        slots = per_row * (height // r)
        if origins is None and count > slots:
            raise ConfigError(f"{count} blocks of {r}x{c} cores do not fit the {width}x{height} mesh "
                              f"(room for {slots}); use a linear layout or fewer groups")
        order = _cycle(r, c) if kind == "ring" else [(x if y % 2 == 0 else c - 1 - x, y)
                                                       for y in range(r) for x in range(c)]
        for g in range(count):
            if origins is not None:
                ox, oy = origins[g] % width, origins[g] // width
                if not 0 <= origins[g] < n or ox + c > width or oy + r > height:
                    valid = [y * width + x for y in range(height - r + 1) for x in range(width - c + 1)]
                    raise ConfigError(f"layout.origin {origins[g]}: a {r}x{c} block does not fit there (the origin is "
                                      f"its north-west corner; valid origins: {_ranges(valid)})")
            else:
                # blocks snake through the grid so consecutive groups are neighbours
                brow, bcol = divmod(g, per_row)
                bcol = bcol if brow % 2 == 0 else per_row - 1 - bcol
                ox, oy = bcol * c, brow * r
            cores = [(oy + dy) * width + ox + dx for dx, dy in order]
            groups.append(Group(g // stages, g % stages, tuple(cores), (r, c)))
    else:
        raise ConfigError(f"layout '{kind}': expected one of linear_seq, linear_interleave, ring, mesh2d")
    used = [c for g in groups for c in g.cores]
    if len(set(used)) != len(used):
        raise ConfigError("layout.origin: TP groups overlap")
    return groups


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2, 5'``."""
    out, start = [], None
    for i, v in enumerate(ids):
        if start is None:
            start = v
        if i + 1 == len(ids) or ids[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def ring_hop_counts(cores, width: int) -> list[int]:
    """Mesh hops between ring neighbours (:func:`npusim.hw.noc.routing.grid_hops`)."""
    n = len(cores)
    if n < 2:
        return []
    return [int(h) for h in grid_hops(list(cores), list(cores[1:]) + [cores[0]], width)]
