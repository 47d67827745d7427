"""The simulation loop: the engine's event heap driving the hardware models, in Numba.

One ``@njit`` function, :func:`run_loop`, advances time: it starts every task that
may start (dispatching on the task's kind to the model that times it) and pops
events in (time, sequence) order, routing each to its model. It returns to Python
when the clock would pass ``until``, when the watched task completes, after
``max_events`` events (so Python can update a progress bar), when the heap or the
NoC's message slots need to grow, or when nothing is left to do.

Task kinds and their parameters (``param[:, i]``):

* ``KIND_FIXED`` (0): duration ``param[0]`` cycles (compute tasks: the duration comes
  from the compute model when the task is built; at the TLM memory fidelity a compute task
  with SRAM demand ``param[2]`` may be stretched at its start by DMA traffic competing for the
  core's SRAM ports, :mod:`npusim.sim.sramport`).
* ``KIND_DMA`` (1): an HBM transfer timed by :mod:`npusim.hw.memory.hbm`:
  ``bytes, address, is_write, initiator, pattern, stride``. At the path and flit NoC
  fidelities its transaction streams also cross the mesh between the core and the channels'
  routers (:mod:`npusim.sim.mempath`): the task ends when the DRAM access and every stream
  (``EV_NOC_PART_END``) have ended.
* ``KIND_NOC`` (2): a message over the NoC, timed by :mod:`npusim.hw.noc.path`
  (path-level or analytical) or :mod:`npusim.hw.noc.flit_engine` (flit level):
  ``src_router, dst_router, bytes``.
* ``KIND_NOTIFY`` (3): like ``KIND_FIXED``, and the loop returns to Python when it
  completes (``STATUS_NOTIFY``, the task in ``sc[SC_NOTIFIED]``): how a driver with
  several things in flight (serving instances, KV transfers) learns which finished.

Speed rule: a model function called per task or per event is ``@njit(..., inline="always")``.
Numba passes a namedtuple of arrays (a model's state) to a function it does not inline as every
array's fields, so such a call costs more than most models' work (an analytical DMA took ~1 µs
in the kernel against ~0.35 µs for its model function called in a loop). The price is compile
time: Numba copies an inlined function's IR at each call site, at a cost that grows with the square
of its size, so a large inlined function is called from one site where it can be (``path_handle``
calls ``_claim`` once), and a small function of plain arrays and integers called from many places
is not inlined (``event_push``: such a call is cheap). See docs/ARCHITECTURE.md (cold compile).

Compile only what a run uses: the loop is built per *fidelity* by :func:`kernel_for` --
``tlm`` (the TLM memory model and the SRAM ports, else the analytical memory model alone) and
``flit`` (the flit NoC, else the path or analytical NoC) are constants of each variant's closure,
so Numba's dead-branch pruning drops the other models' calls before typing and never compiles
them (the TLM model's event handlers and the flit NoC's cycle step are ~40% of a full kernel's
compile). Each variant is a ``cache=True`` function of its own (Numba keys a closure's cache entry by
its constants' values). The variant with both flags set is the general loop: it handles every
fidelity and is what the loop was before the split. :func:`run_loop` keeps the old entry point:
it picks the variant from the models' states.
"""

from __future__ import annotations

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.core import mark_finished, mark_started, pop_ready, release_queue
from npusim.engine.eventlist import event_next_time, event_pop, event_push, event_room
from npusim.engine.heap import HS_SIZE
from npusim.engine.tasks import EV_QUEUE_FREE, EV_TASK_END, KIND_FIXED, SC_NEVENTS, SC_NOTIFIED, SC_NOW
from npusim.hw.memory.hbm import EV_MEM_END_REQ, EV_MEM_ISSUE, analytical_finish, hbm_handle, hbm_start_dma
from npusim.hw.memory.params import MODE_ANALYTICAL, P_MODE
from npusim.hw.noc.flit_engine import EV_FLIT_TICK, flit_slots_free, flit_start, flit_tick
from npusim.hw.noc.memflow import (EV_MFLOW_UPDATE, EV_MOUSE_END, memflow_mouse_end, memflow_note, memflow_poke,
                                   memflow_update)
from npusim.hw.noc.path import C_HOLDS_CHANGED, EV_NOC_PART_END, MODE_FLIT, PRM_MODE, path_handle, path_start, slots_free
from npusim.sim.mempath import MP_NEED_SLOTS, MP_ON, mem_part_done, mem_start
from npusim.sim.sramport import P_SRAM_BITS, P_SRAM_STALL, SP_ON, sram_task_cycles

KIND_DMA = 1
KIND_NOC = 2
KIND_NOTIFY = 3

(STATUS_IDLE, STATUS_TIME_LIMIT, STATUS_WATCH, STATUS_GROW, STATUS_EVENT_LIMIT, STATUS_GROW_NOC,
 STATUS_GROW_FLIT, STATUS_NOTIFY) = range(8)

# events one task start or one event handler can push, besides one per hop of a NoC
# path (the caller adds the topology's diameter): the heap keeps this much room
BASE_HEADROOM = 8


def _build(tlm: bool, flit: bool):
    """The simulation loop for one fidelity (see the module docstring). ``TLM`` and ``FLIT`` are
    closure constants: Numba prunes the branches they rule out before typing, so the models
    those branches call are neither typed nor compiled. A task's start is written out in the
    loop (not a helper) because a closure that referred to another jitted closure would not be
    cacheable (the cache key pickles the closure's values)."""
    TLM = tlm
    FLIT = flit

    @njit(cache=True, _nrt=False, nogil=True)  # no Python objects inside: simulators may run in threads
    def run_loop(tt, heap, hs, mem, noc, fnoc, mp, sp, period_ps, until, watch, max_events, headroom):
        """Advance the simulation; returns a ``STATUS_*`` code (see module docstring).
        ``headroom``: free heap rows needed before any handler runs (see ``BASE_HEADROOM``)."""
        events = 0
        while True:
            # start everything that may start now
            while True:
                if event_room(heap, hs) < headroom:
                    return STATUS_GROW
                need = mp.prm[MP_NEED_SLOTS] if mp.prm[MP_ON] != 0 else 1  # a DMA may start 2 per router
                if FLIT:
                    if slots_free(noc) < (need if noc.prm[PRM_MODE] != MODE_FLIT else 1):
                        return STATUS_GROW_NOC
                    if flit_slots_free(fnoc) < (need if noc.prm[PRM_MODE] == MODE_FLIT else 1):
                        return STATUS_GROW_FLIT
                else:
                    if slots_free(noc) < need:
                        return STATUS_GROW_NOC
                task = pop_ready(tt)
                if task < 0:
                    break
                # start the task: dispatch on its kind to the model that times it
                now = tt.sc[SC_NOW]
                mark_started(tt, task, now)
                kind = tt.kind[task]
                if kind == KIND_FIXED:
                    if TLM:
                        dur = sram_task_cycles(sp, mem.in_task, mem.in_left, tt.queue[task], tt.param[task, 0],
                                               tt.param[task, P_SRAM_BITS], tt.param[task, P_SRAM_STALL])
                    else:
                        dur = tt.param[task, 0]
                    event_push(heap, hs, now + dur, EV_TASK_END, task)
                elif kind == KIND_NOTIFY:
                    event_push(heap, hs, now + tt.param[task, 0], EV_TASK_END, task)
                elif kind == KIND_DMA:
                    prm = tt.param[task]
                    parts = mem_start(mp, noc, fnoc, heap, hs, prm[3], task, prm[0], prm[1], prm[2], prm[4], prm[5],
                                      now)
                    if TLM:
                        done = hbm_start_dma(mem, heap, hs, prm[3], task, prm[0], prm[1], prm[2], prm[4], prm[5],
                                             now, period_ps)
                    elif prm[0] <= 0:  # what hbm_start_dma does at the analytical fidelity
                        done = now
                    else:
                        done = analytical_finish(mem, prm[3], prm[1], prm[0], prm[4], prm[5], now, period_ps)
                    if done >= 0:
                        if parts > 0:  # the DRAM part is done; its last response still crosses the mesh
                            event_push(heap, hs, done + mp.tail[prm[3]], EV_NOC_PART_END, prm[3])
                        else:
                            event_push(heap, hs, done, EV_TASK_END, task)
                elif kind == KIND_NOC:
                    prm = tt.param[task]
                    if FLIT and noc.prm[PRM_MODE] == MODE_FLIT:
                        flit_start(fnoc, heap, hs, task, prm[0], prm[1], prm[2], now)
                    else:
                        path_start(noc, heap, hs, task, prm[0], prm[1], prm[2], now)
                else:
                    # unknown kinds are rejected at submission; finish at once to stay safe
                    event_push(heap, hs, now, EV_TASK_END, task)
            if hs[HS_SIZE] == 0:
                return STATUS_IDLE
            if event_next_time(heap, hs) > until:
                tt.sc[SC_NOW] = max(tt.sc[SC_NOW], until)
                return STATUS_TIME_LIMIT
            if events >= max_events:
                return STATUS_EVENT_LIMIT
            if event_room(heap, hs) < headroom:
                return STATUS_GROW
            time, etype, eid = event_pop(heap, hs)
            now = max(time, tt.sc[SC_NOW])
            tt.sc[SC_NOW] = now
            tt.sc[SC_NEVENTS] += 1
            events += 1
            finished = -1
            if etype == EV_TASK_END:
                finished = eid
            elif etype == EV_QUEUE_FREE:
                release_queue(tt, eid, now)
            elif etype <= EV_MEM_ISSUE and etype >= EV_MEM_END_REQ:
                if TLM:  # the analytical memory model pushes no events of its own
                    finished = hbm_handle(mem, heap, hs, etype, eid, now, period_ps)
                    if finished >= 0 and mp.prm[MP_ON] != 0:
                        init = tt.param[finished, 3]
                        if mp.task[init] == finished:  # its streams are counted as parts
                            event_push(heap, hs, now + mp.tail[init], EV_NOC_PART_END, init)
                            finished = -1
            elif etype == EV_NOC_PART_END:
                finished = mem_part_done(mp, eid)
            elif etype == EV_MOUSE_END:  # a DMA run as a mouse of the memory flows: one of its parts
                memflow_mouse_end(mp.fl, noc.link_holds, heap, hs, eid, now)
                finished = mem_part_done(mp, eid)
            elif etype == EV_MFLOW_UPDATE:
                changed = noc.counters[C_HOLDS_CHANGED]
                if changed != 0:  # links a message's start claimed since the last path event: the flows see them
                    noc.counters[C_HOLDS_CHANGED] = 0
                    memflow_note(mp.fl, noc.link_holds, changed)
                memflow_update(mp.fl, noc.link_holds, heap, hs, eid, now, mp.pending)
            elif etype == EV_FLIT_TICK:
                if FLIT:  # only the flit NoC pushes ticks
                    flit_tick(fnoc, heap, hs, now)
            else:
                path_handle(noc, heap, hs, etype, eid, now)
                changed = noc.counters[C_HOLDS_CHANGED]
                if changed != 0:  # a message claimed or freed a link (link + 1, or -1: several): the flows see it
                    noc.counters[C_HOLDS_CHANGED] = 0
                    memflow_poke(mp.fl, noc.link_holds, heap, hs, now, changed)
            if finished >= 0:
                mark_finished(tt, finished, now)
                if finished == watch:
                    return STATUS_WATCH
                if tt.kind[finished] == KIND_NOTIFY:
                    tt.sc[SC_NOTIFIED] = finished
                    return STATUS_NOTIFY

    return run_loop


#: the loop per fidelity, ``(tlm, flit) -> dispatcher``: built on first use (building is cheap;
#: Numba compiles, or loads from its cache, on the first call)
_KERNELS: dict[tuple[bool, bool], object] = {}


def kernel_for(tlm: bool, flit: bool):
    """The simulation loop for a fidelity: ``tlm`` the TLM memory model (with the SRAM ports),
    ``flit`` the flit NoC. ``kernel_for(True, True)`` handles every fidelity."""
    key = (bool(tlm), bool(flit))
    kernel = _KERNELS.get(key)
    if kernel is None:  # setdefault: simulators built in threads at once all get the same dispatcher
        kernel = _KERNELS.setdefault(key, _build(*key))
    return kernel


def fidelity_of(mem, noc, sp) -> tuple[bool, bool]:
    """``(tlm, flit)`` of models' states: the variant of :func:`kernel_for` that can run them (the
    analytical memory model's states push no memory events and leave the SRAM ports off)."""
    tlm = int(mem.p[P_MODE]) != MODE_ANALYTICAL or int(sp.prm[SP_ON]) != 0
    return tlm, int(noc.prm[PRM_MODE]) == MODE_FLIT


def run_loop(tt, heap, hs, mem, noc, fnoc, mp, sp, period_ps, until, watch, max_events, headroom):
    """Advance the simulation with the loop for the models' fidelity (:func:`fidelity_of`);
    returns a ``STATUS_*`` code. Callers that enter it often keep ``kernel_for(...)`` instead."""
    kernel = kernel_for(*fidelity_of(mem, noc, sp))
    return kernel(tt, heap, hs, mem, noc, fnoc, mp, sp, period_ps, until, watch, max_events, headroom)
