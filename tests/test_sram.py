"""SRAM bank model: contiguous access uses every bank, strides conflict as expected."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch.schema import Sram
from npusim.hw.memory.sram import sram_access_cost

SRAM = Sram(capacity_mb=1, banks=8, bytes_per_cycle_per_bank=16, access_latency_cycles=2, bank_interleave_bytes=16)


def test_contiguous_uses_all_banks():
    c = sram_access_cost(SRAM, count=64, access_bytes=16)  # 1 KiB contiguous
    assert c.cycles == 1024 // (8 * 16) + 2
    assert c.banks_used == 8 and c.conflict_factor == 1.0


def test_stride_of_all_banks_hits_one_bank():
    c = sram_access_cost(SRAM, count=64, access_bytes=16, stride_bytes=8 * 16)
    assert c.banks_used == 1
    assert c.cycles == 64 + 2 and c.conflict_factor == 8.0


def test_stride_of_two_units_uses_half_the_banks():
    c = sram_access_cost(SRAM, count=64, access_bytes=16, stride_bytes=32)
    assert c.banks_used == 4 and c.cycles == 16 + 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        sram_access_cost(SRAM, count=1, access_bytes=0)
    with pytest.raises(ValueError):
        sram_access_cost(SRAM, count=1, access_bytes=4, stride_bytes=0)


@settings(max_examples=examples(60), deadline=None)
@given(count=st.integers(1, 300), access=st.integers(1, 70), stride=st.integers(1, 400))
def test_matches_brute_force_and_never_beats_peak(count, access, stride):
    c = sram_access_cost(SRAM, count, access, stride)
    per_bank = [0] * 8
    for i in range(count):
        for byte in range(i * stride, i * stride + access):
            per_bank[(byte // 16) % 8] += 1
    expected = max(-(-b // 16) for b in per_bank) + 2
    assert c.cycles == expected
    assert c.bytes_per_cycle <= 8 * 16
