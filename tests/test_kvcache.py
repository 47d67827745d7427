"""KV-cache memory manager: hand cases for each policy, then random sequences and a
state machine that check the invariants after every step and conservation at the end."""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hyp import examples
from npusim.errors import ConfigError
from npusim.serving.kvcache import EXCEEDS_HBM, HBM_FULL, KVCacheManager, Transfer

BPT = 10  # bytes per token in hand cases
B = 16  # tokens per block


def mgr(blocks=4, hbm_tokens=10_000, **kw):
    """A manager whose SRAM pool holds exactly ``blocks`` blocks of ``B`` tokens."""
    kw.setdefault("debug", True)
    return KVCacheManager(sram_bytes=blocks * B * BPT, hbm_bytes=hbm_tokens * BPT, bytes_per_token=BPT,
                          block_tokens=B, **kw)


def assert_all_free(m: KVCacheManager):
    m.evict_prefix_cache()
    occ = m.occupancy()
    assert occ["blocks_free"] == m.blocks_total
    assert occ["hbm_used_bytes"] == 0 and occ["hbm_largest_free_bytes"] == m.hbm_bytes
    assert occ["running_requests"] == 0 and occ["prefix_nodes"] == 0
    m.check_invariants()


# ---------------------------------------------------------------------------- construction
def test_static_regions_shrink_the_pool_and_must_fit():
    m = KVCacheManager(sram_bytes=1000, hbm_bytes=10_000, bytes_per_token=BPT, block_tokens=B,
                       weights_bytes=300, activation_bytes=200, temp_bytes=100)
    assert m.blocks_total == (1000 - 600) // (B * BPT) == 2
    assert m.kv_base_bytes == 600
    occ = m.occupancy()
    assert occ["sram_used_bytes"] == 600 and occ["sram_total"] == 1000 and occ["sram_kv_used_bytes"] == 0
    with pytest.raises(ConfigError, match="exceed"):
        KVCacheManager(sram_bytes=1000, hbm_bytes=10, bytes_per_token=1, weights_bytes=900, temp_bytes=101)


@pytest.mark.parametrize("kw", [dict(bytes_per_token=0), dict(block_tokens=0), dict(admission="lottery"),
                                dict(hbm_bytes=-1), dict(prefix_cache=True, block_tokens=24)])
def test_bad_parameters_are_config_errors(kw):
    args = dict(sram_bytes=1000, hbm_bytes=1000, bytes_per_token=1) | kw
    with pytest.raises(ConfigError):
        KVCacheManager(**args)


def test_caller_misuse_raises():
    m = mgr()
    assert m.admit(1, 10, 5)
    with pytest.raises(ValueError, match="already admitted"):
        m.admit(1, 10, 5)
    with pytest.raises(ValueError):
        m.admit(2, 0, 5)
    with pytest.raises(ValueError, match="more than the 15 reserved"):
        m.append(1, 16)
    with pytest.raises(ValueError):
        m.append(1, -1)
    with pytest.raises(KeyError, match="not admitted"):
        m.location(99)
    m.free(1)
    with pytest.raises(KeyError):
        m.free(1)


# ---------------------------------------------------------------------------- SRAM and spills
def test_fits_in_sram():
    m = mgr(blocks=4)
    assert m.admit("a", 40, 20).ok
    assert m.append("a", 40) == []
    assert m.append("a", 1) == []
    assert m.location("a") == (41, 0)
    assert m.occupancy()["blocks_free"] == 4 - 3
    assert len(m.sram_blocks("a")) == 3
    assert m.append("a", 0) == []
    m.free("a")
    assert_all_free(m)


def test_spills_exactly_when_the_pool_is_exhausted():
    m = mgr(blocks=4)
    assert m.admit(7, 64, 100)
    assert m.append(7, 64) == []  # exactly 4 full blocks
    assert m.location(7) == (64, 0) and m.occupancy()["blocks_free"] == 0
    ring_off, ring_size = m.hbm_extent(7)
    assert ring_size == 164 * BPT
    spills = m.append(7, 1)  # the 65th token needs a 5th block: the oldest block goes to HBM
    assert spills == [Transfer(7, B * BPT, B, ring_off)]
    assert m.location(7) == (49, 16)
    # decode one token at a time: one block spilled every 16 tokens, written after the last
    spilled = [m.append(7, 1) for _ in range(99)]
    events = [(i, t) for i, ts in enumerate(spilled) for t in ts]
    assert [i for i, _ in events] == [15, 31, 47, 63, 79, 95]
    assert [t.hbm_offset_bytes for _, t in events] == [ring_off + k * B * BPT for k in range(1, 7)]
    assert all(t.nbytes == B * BPT and t.direction == "sram_to_hbm" for _, t in events)
    s, h = m.location(7)
    assert s + h == 164 and h == 7 * B and s <= 4 * B
    st_ = m.stats()
    assert st_["spills"] == 7 and st_["spilled_bytes"] == 7 * B * BPT and st_["direct_hbm_write_bytes"] == 0
    m.free(7)
    assert_all_free(m)


def test_growing_request_spills_its_own_blocks_then_writes_straight_to_hbm():
    m = mgr(blocks=4)
    assert m.admit(1, 40, 0) and m.admit(2, 60, 0)
    m.append(1, 40)  # 3 blocks
    t = m.append(2, 30)  # 1 free block: the newest 14 tokens stay, 16 go straight to HBM
    assert m.location(1) == (40, 0)  # never robbed by another request
    assert t == [Transfer(2, 16 * BPT, 16, m.hbm_extent(2)[0])]
    assert m.location(2) == (14, 16)
    t = m.append(2, 20)  # own block spilled (14 tokens) + 18 new tokens straight to HBM
    assert t == [Transfer(2, 32 * BPT, 32, m.hbm_extent(2)[0] + 16 * BPT)]
    assert m.location(2) == (2, 48)
    assert m.stats()["direct_hbm_write_bytes"] == (16 + 18) * BPT
    m.free(1)
    assert m.append(2, 10) == []  # freed blocks are reused
    assert m.location(2) == (12, 48)
    m.free(2)
    assert_all_free(m)


def test_no_sram_pool_puts_everything_in_hbm():
    m = KVCacheManager(sram_bytes=100, hbm_bytes=10_000, bytes_per_token=BPT, block_tokens=B, debug=True)
    assert m.blocks_total == 0
    assert m.admit(1, 30, 5)
    assert m.append(1, 30) == [Transfer(1, 300, 30, 0)]
    assert m.location(1) == (0, 30)
    m.free(1)
    assert_all_free(m)


# ---------------------------------------------------------------------------- admission
def test_queue_refuses_when_hbm_is_full_and_admits_after_free():
    m = mgr(hbm_tokens=300)
    assert m.admit(1, 100, 50) and m.admit(2, 50, 50)
    adm = m.admit(3, 40, 30)
    assert not adm and adm.code == HBM_FULL and not adm.permanent and adm.preempted == []
    assert "700 B" in adm.reason and "wait" in adm.reason
    assert 3 not in m and m.running == [1, 2]
    m.free(2)
    assert m.admit(3, 40, 30)
    assert m.stats()["rejections"] == {HBM_FULL: 1}


def test_preempt_evicts_the_most_recently_admitted_and_only_once():
    m = mgr(hbm_tokens=300, admission="preempt")
    assert m.admit(1, 100, 50) and m.admit(2, 30, 20) and m.admit(3, 30, 20)
    m.append(2, 30), m.append(3, 30)
    adm = m.admit(4, 80, 40)  # needs 120 tokens, 50 free: preempt 3, then 2
    assert adm.ok and adm.preempted == [3, 2]
    assert m.running == [1, 4] and 2 not in m and 3 not in m
    assert m.stats()["preemptions"] == 2
    # a preempted request neither preempts nor gets preempted again: it waits
    adm = m.admit(3, 30, 20)
    assert not adm and adm.code == HBM_FULL and adm.preempted == []
    m.free(4)
    assert m.admit(3, 30, 20) and m.admit(2, 30, 20)
    # 3 and 2 are protected; 1 alone (150) plus the free 50 cannot hold 210: nobody is preempted
    adm = m.admit(5, 210, 0)
    assert not adm and adm.preempted == [] and m.running == [1, 3, 2]
    assert m.stats()["preemptions"] == 2


def test_request_larger_than_hbm_is_rejected_for_good():
    for admission in ("queue", "preempt"):
        m = mgr(hbm_tokens=100, admission=admission)
        assert m.admit(1, 10, 10)
        adm = m.admit(2, 90, 11)
        assert not adm and adm.permanent and adm.code == EXCEEDS_HBM
        assert "never" in adm.reason and "1010 B" in adm.reason and "1000 B" in adm.reason
        assert adm.preempted == [] and m.running == [1]
        assert m.stats()["rejections"] == {EXCEEDS_HBM: 1}


def test_hbm_first_fit_coalesces_on_free():
    m = mgr(hbm_tokens=100)
    for i in range(4):
        assert m.admit(i, 20, 5)  # 25 tokens each
    m.free(1), m.free(2)
    assert m.occupancy()["hbm_largest_free_bytes"] == 50 * BPT  # 25+25 merged
    assert m.admit(9, 40, 10)  # fits only in the merged hole
    assert m.hbm_extent(9) == (25 * BPT, 50 * BPT)


# ---------------------------------------------------------------------------- prefix reuse
P = 64  # small prefix blocks keep the hand cases short


def pmgr(blocks=64, hbm_tokens=10_000, **kw):
    return mgr(blocks=blocks, hbm_tokens=hbm_tokens, prefix_cache=True, prefix_block_tokens=P, **kw)


def test_prefix_reuse_hits_and_refcounts():
    m = pmgr()
    assert m.admit("a", 3 * P + 10, 4, hash_ids=[1, 2, 3, 4]).prefix_hit_tokens == 0
    m.append("a", 3 * P + 10)
    m.append("a", 3)
    m.free("a")  # donates its 3 full input blocks (the partial 4th is not cached)
    assert m.occupancy()["prefix_nodes"] == 3
    assert m.occupancy()["blocks_free"] == 64 - 3 * P // B
    b = m.admit("b", 3 * P + 5, 4, hash_ids=[1, 2, 9, 9])
    assert b.prefix_hit_tokens == 2 * P
    c = m.admit("c", 2 * P, 4, hash_ids=[1, 2])  # capped: at least one input token is computed
    assert c.prefix_hit_tokens == P
    d = m.admit("d", 3 * P + 1, 4, hash_ids=[5, 2, 3])  # same ids at later positions, other parent: miss
    assert d.prefix_hit_tokens == 0
    assert m.location("b") == (2 * P, 0) and m.location("c") == (P, 0)
    assert m.hbm_extent("b")[1] == (3 * P + 9 - 2 * P) * BPT  # ring smaller by the hit
    refs = sorted(n.refs for n in m._nodes.values())
    assert refs == [0, 1, 2]
    m.append("b", P + 5)
    assert sum(m.location("b")) == 3 * P + 5
    with pytest.raises(ValueError):
        m.append("b", P)  # the cap excludes the hit tokens
    for r in ("b", "c", "d"):
        m.free(r)
    s = m.stats()
    assert s["prefix_hit_requests"] == 2 and s["prefix_hit_tokens"] == 3 * P and s["prefix_lookups"] == 4
    assert all(n.refs == 0 for n in m._nodes.values())
    assert m.occupancy()["prefix_nodes_unreferenced"] == m.occupancy()["prefix_nodes"]
    assert_all_free(m)


def test_prefix_nodes_demote_lru_when_sram_is_needed():
    m = pmgr(blocks=2 * P // B)  # the pool holds exactly two prefix blocks
    assert m.admit("a", 2 * P, 0, hash_ids=[1, 2])
    m.append("a", 2 * P)
    m.free("a")
    assert m.occupancy()["blocks_free"] == 0 and m.occupancy()["blocks_reclaimable"] == 2 * P // B
    assert m.admit("x", 10, 0)
    t = m.append("x", 10)  # needs one block: the LRU node (the leaf, block 2) is demoted
    assert t == [Transfer(None, P * BPT, P, m._trie[(m._trie[(-1, 1)].sid, 2)].hbm_off)]
    assert m.location("x") == (10, 0)
    hit = m.admit("b", 2 * P + 1, 0, hash_ids=[1, 2, 3])
    assert hit.prefix_hit_tokens == 2 * P
    assert m.location("b") == (P, P)  # first block still in SRAM, second demoted to HBM
    assert m.stats()["prefix_demotions"] == 1 and m.stats()["prefix_demoted_bytes"] == P * BPT


def test_prefix_nodes_evicted_lru_when_hbm_is_needed():
    m = pmgr(hbm_tokens=4 * P)
    assert m.admit("a", 2 * P, 0, hash_ids=[1, 2]) and m.admit("b", P, 0, hash_ids=[7])
    m.append("a", 2 * P), m.append("b", P)
    m.free("b"), m.free("a")  # "a"'s nodes are more recent than "b"'s
    assert m.occupancy()["hbm_used_bytes"] == 3 * P * BPT
    assert m.admit("c", 3 * P, 0)  # evicts [7] (oldest), then the leaf [1,2], never its parent [1]
    assert m.stats()["prefix_evictions"] == 2
    assert set(m._trie) == {(-1, 1)}
    m.free("c")
    assert_all_free(m)


def test_donated_block_straddling_sram_and_hbm():
    m = pmgr(blocks=P // B + 2)
    assert m.admit("a", 2 * P, 0, hash_ids=[1, 2])
    m.append("a", 2 * P)  # only P + 2B tokens fit: tokens [0, P - 2B) spill
    assert m.location("a") == (P + 2 * B, P - 2 * B)
    m.free("a")
    first = m._trie[(-1, 1)]
    second = m._trie[(first.sid, 2)]
    assert (first.tokens - first.hbm_tokens, first.hbm_tokens) == (2 * B, P - 2 * B)
    assert (second.tokens - second.hbm_tokens, second.hbm_tokens) == (P, 0)
    assert m.admit("b", 2 * P + 1, 0, hash_ids=[1, 2]).prefix_hit_tokens == 2 * P
    assert m.location("b") == (P + 2 * B, P - 2 * B)


def test_free_returns_every_block_and_byte():
    m = mgr(blocks=8, hbm_tokens=2000)
    rng = random.Random(1)
    for i in range(20):
        inp = rng.randint(1, 50)
        assert m.admit(i, inp, rng.randint(0, 40))
        m.append(i, rng.randint(0, inp))
    for i in range(20):
        m.free(i)
    assert_all_free(m)


def test_check_invariants_catches_corruption():
    m = mgr(debug=False)
    m.admit(1, 40, 0), m.append(1, 40)
    m.admit(2, 40, 0), m.append(2, 10)
    m.check_invariants()
    a, b = m.sram_blocks(1)[0], m.sram_blocks(2)[0]
    m.next_block[a] = b  # request 1's list now runs into request 2's
    with pytest.raises(AssertionError, match="request 1"):
        m.check_invariants()
    m = mgr(debug=False)
    m.admit(1, 40, 0), m.append(1, 40)
    m._free_top += 1  # an owned block appears free as well
    with pytest.raises(AssertionError, match="invariant"):
        m.check_invariants()


# ---------------------------------------------------------------------------- random sequences
SHARED_BITS = st.sampled_from([0, 0, 0, 0, 1])  # hash ids biased so that prefixes are shared


@st.composite
def configs(draw):
    block = draw(st.sampled_from([1, 2, 4, 8]))
    bpt = draw(st.integers(1, 5))
    return dict(
        sram_bytes=draw(st.integers(0, 24)) * block * bpt + draw(st.integers(0, block * bpt - 1)),
        hbm_bytes=draw(st.integers(0, 400)) * bpt,
        bytes_per_token=bpt, block_tokens=block,
        temp_bytes=0, admission=draw(st.sampled_from(["queue", "preempt"])),
        prefix_cache=draw(st.booleans()), prefix_block_tokens=8, debug=True)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 12))
    reqs = []
    for i in range(n):
        inp = draw(st.integers(1, 60))
        hashes = draw(st.lists(SHARED_BITS, min_size=math.ceil(inp / 8), max_size=math.ceil(inp / 8)))
        reqs.append((i, inp, draw(st.integers(0, 30)), hashes))
    return reqs


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), reqs=workloads(), seed=st.integers(0, 2**16), chunk=st.integers(1, 40))
def test_serving_loop_finishes_or_rejects_every_request(cfg, reqs, seed, chunk):
    """A little continuous-batching loop: FCFS admission, chunked prefill then decode,
    preempted requests requeued at the front. Everything must drain."""
    m = KVCacheManager(**cfg)
    rng = random.Random(seed)
    waiting = deque(reqs)
    running: dict[int, list] = {}  # id -> [input, output, hit, appended, target]
    outcome: dict[int, str] = {}
    for _ in range(10_000):
        if not waiting and not running:
            break
        while waiting:
            rid, inp, out, hashes = waiting[0]
            adm = m.admit(rid, inp, out, hashes)
            if not adm:
                assert adm.reason and adm.code in (HBM_FULL, EXCEEDS_HBM) and adm.preempted == []
                if adm.permanent:
                    assert (inp + out) * cfg["bytes_per_token"] > cfg["hbm_bytes"]
                    outcome[rid] = "rejected: " + adm.reason
                    waiting.popleft()
                    continue
                assert running, "refused with nothing running: a request could wait forever"
                break
            waiting.popleft()
            for v in adm.preempted:
                waiting.appendleft(next(r for r in reqs if r[0] == v))
                del running[v]
            running[rid] = [inp, out, adm.prefix_hit_tokens, 0, inp + out - adm.prefix_hit_tokens]
        for rid, st_ in list(running.items()):
            inp, out, hit, done, target = st_
            step = min(target - done, rng.randint(1, chunk) if hit + done < inp else 1)
            for t in m.append(rid, step):
                assert t.nbytes == t.tokens * cfg["bytes_per_token"] > 0
            st_[3] += step
            assert sum(m.location(rid)) == hit + st_[3]
            if st_[3] == target:
                m.free(rid)
                del running[rid]
                outcome[rid] = "finished"
    assert not waiting and not running
    assert sorted(outcome) == [r[0] for r in reqs]
    assert_all_free(m)


class KVMachine(RuleBasedStateMachine):
    """Random admit / append / free / evict sequences against a tiny model of the tokens."""

    @initialize(cfg=configs())
    def setup(self, cfg):
        self.m = KVCacheManager(**cfg)
        self.cfg = cfg
        self.next_id = 0
        self.live: dict[int, list] = {}  # id -> [hit, appended, cap]
        self.outcomes: dict[int, str] = {}

    @rule(inp=st.integers(1, 70), out=st.integers(0, 30), bits=st.lists(SHARED_BITS, max_size=9))
    def admit(self, inp, out, bits):
        rid = self.next_id
        self.next_id += 1
        adm = self.m.admit(rid, inp, out, bits[:math.ceil(inp / 8)])
        for v in adm.preempted:
            del self.live[v]
            self.outcomes[v] = "preempted"
        if adm:
            assert adm.prefix_hit_tokens % 8 == 0 and adm.prefix_hit_tokens < inp
            self.live[rid] = [adm.prefix_hit_tokens, 0, inp + out - adm.prefix_hit_tokens]
        else:
            assert adm.reason and adm.code and adm.preempted == []
            self.outcomes[rid] = "rejected: " + adm.reason

    @rule(pick=st.integers(0, 10**6), frac=st.floats(0, 1))
    def append(self, pick, frac):
        if not self.live:
            return
        rid = sorted(self.live)[pick % len(self.live)]
        hit, done, cap = self.live[rid]
        n = int((cap - done) * frac)
        before_h = self.m.location(rid)[1]
        moved = sum(t.tokens for t in self.m.append(rid, n) if t.request_id == rid)
        assert self.m.location(rid)[1] - before_h == moved  # every HBM token arrived by a transfer
        self.live[rid][1] += n

    @rule(pick=st.integers(0, 10**6))
    def free(self, pick):
        if not self.live:
            return
        rid = sorted(self.live)[pick % len(self.live)]
        self.m.free(rid)
        del self.live[rid]
        self.outcomes[rid] = "finished"

    @rule()
    def evict(self):
        self.m.evict_prefix_cache()

    @invariant()
    def consistent(self):
        self.m.check_invariants()
        for rid, (hit, done, _) in self.live.items():
            assert sum(self.m.location(rid)) == hit + done
        occ = self.m.occupancy()
        assert occ["sram_used_bytes"] <= occ["sram_total"] and occ["hbm_used_bytes"] <= occ["hbm_total"]

    def teardown(self):
        for rid in list(self.live):
            self.m.free(rid)
            self.outcomes[rid] = "finished"
        assert sorted(self.outcomes) == list(range(self.next_id))
        assert all(o == "finished" or o == "preempted" or o.startswith("rejected: ") for o in self.outcomes.values())
        assert_all_free(self.m)


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(max_examples=examples(150), stateful_step_count=50, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


def test_many_operations_keep_the_invariants():
    """10^4 admits/appends/frees over ~200 concurrent requests leave the block accounting
    consistent (speed is measured by benchmarks, not here)."""
    m = KVCacheManager(sram_bytes=2**20, hbm_bytes=2**30, bytes_per_token=256, block_tokens=16,
                       prefix_cache=True)
    rng = np.random.default_rng(0)
    live = {}
    for i in range(2000):
        inp = int(rng.integers(1, 2000))
        adm = m.admit(i, inp, 64, hash_ids=list(rng.integers(0, 2, 4)))
        if adm:
            live[i] = 0
            m.append(i, inp - adm.prefix_hit_tokens)
        for rid in list(live)[-5:]:
            if live[rid] < 60:
                m.append(rid, 1)
                live[rid] += 1
        if len(live) > 200:
            oldest = next(iter(live))
            m.free(oldest)
            del live[oldest]
    m.check_invariants()
