"""How an operator row was timed (issue 39, session 44): a host-timed call with synchronize is the eager
runtime's dispatch (a fused-attention op's ``attention_dispatch_us``) + launch + kernel + the
synchronize's return (``runtime.sync_us``, calibrated on the ascend-rs 910B3 launch + synchronize round
trips); a cold single launch is the kernel, said so."""

import pytest

from npusim.errors import NpusimError
from npusim.system.load import load_system
from npusim.system.schema import Runtime
from npusim.validate.calibrate import sync_us
from npusim.validate.operators import host_timed, operator_rows
from npusim.validate.published import published


def test_sync_us_is_the_round_trip_less_the_launch_call_the_crossing_and_the_kernel():
    value, on_die = sync_us()
    # ascend-rs 910B3: 23, 24, 28, 29, 30 us -> median 28; direct launch 8.599; H2D mean 0.7535
    assert value == pytest.approx(28 - 8.599 - 0.7535 - on_die)
    assert 0 < on_die < 10 and value > 0
    assert Runtime().sync_us == pytest.approx(value, abs=1e-4)
    for name in ("atlas-800i-a2", "cloudmatrix384"):
        rt = load_system(name, nodes=1).system.runtime
        assert rt.sync_us == pytest.approx(value, abs=1e-4) and "ascend-rs" in rt.sources["sync_us"]


def test_a_host_timed_call_adds_dispatch_launch_and_synchronize():
    rt = Runtime()
    assert host_timed(100.0, None) == (100.0, "")
    got, how = host_timed(100.0, "sync")
    assert got == pytest.approx(100.0 + rt.host_dispatch_us + rt.kernel_launch_us + rt.sync_us)
    assert "timing sync" in how
    fia, _ = host_timed(100.0, "sync", "attention")  # a fused-attention call: its own dispatch
    assert fia == pytest.approx(100.0 + rt.attention_dispatch_us + rt.kernel_launch_us + rt.sync_us)
    cold, how = host_timed(100.0, "cold")
    assert cold == 100.0 and "not modelled" in how
    with pytest.raises(NpusimError, match="timing 'events'"):
        host_timed(100.0, "events")


def test_each_fa_table_is_run_as_its_harness_timed_it():
    sources = {s["id"]: s for s in published()["operators"]["sources"]}
    assert sources["pto-isa-fa-dsl-watermark-910b2"]["timing"] == "sync"
    assert sources["pto-isa-fa-multicore-a2a3"]["timing"] == "cold"
    assert "timing" not in sources["pto-isa-fa-910b2"]  # the warm table: device time
    rows = operator_rows(families=("attention",))
    by = {}
    for r in rows:
        src = next(k for k, s in sources.items() if s["title"] in r.source)
        by.setdefault(src, []).append(r)
    assert len(by["pto-isa-fa-dsl-watermark-910b2"]) == 8
    assert all("host-timed call" in r.note for r in by["pto-isa-fa-dsl-watermark-910b2"])
    assert all("timing cold" in r.note for r in by["pto-isa-fa-multicore-a2a3"])
    assert not any("timing" in r.note for r in by["pto-isa-fa-910b2"])
    # the same shape on the same die: the host-timed call is the kernel plus the runtime's host part
    rt = Runtime()
    host = rt.attention_dispatch_us + rt.kernel_launch_us + rt.sync_us
    dsl = {r.note.split("shape ")[1]: r.simulated for r in by["pto-isa-fa-dsl-watermark-910b2"]}
    warm = {r.note.split("shape ")[1].replace(", 'layout': 'BSH'", ""): r.simulated for r in by["pto-isa-fa-910b2"]}
    same = [(dsl[k], warm[k.replace(", 'layout': 'BSH'", "")]) for k in dsl if k.replace(", 'layout': 'BSH'", "") in warm]
    assert same and all(a == pytest.approx(b + host) for a, b in same)


def test_the_fused_attention_dispatch_is_the_host_bound_back_to_back_cadence():
    """``attention_dispatch_us`` is the aarch64 back-to-back FIA cadence, and the simulated kernel of
    that shape is well below it (so the cadence is the host's); the row runs against the constant."""
    from npusim.validate.calibrate import _calibration_rows, _row, attention_device_us

    rows, _ = _calibration_rows()
    fia = _row(rows["pto-isa-torch-jit-fa-910b2"], "fused-attention host dispatch")
    assert Runtime().attention_dispatch_us == pytest.approx(fia["measured_us"])
    assert attention_device_us(fia) < fia["measured_us"] / 2
    ran = [r for r in operator_rows(families=("runtime",)) if "fused-attention" in r.name]
    assert len(ran) == 1 and ran[0].half == "calibration" and abs(ran[0].error) < 1e-9
