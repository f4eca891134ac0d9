# A CPU emulation of plugins/cuda/ops/wgmma_gemm.cu's Hopper GEMM (hopper_wgmma_kernel and the
# WgPlan host code), written to check its layouts without a GPU, with integer data so the result
# must be exact. The kernel's side is copied by hand from the .cu (change both together):
#   - the host: WgPlan's declines and Operand fields, and the arguments of every
#     cuTensorMapEncodeTiled call (global dims, byte strides, box, element strides, swizzle);
#   - the producer: each K tile's TMA boxes (destination, coordinates) and its expect_tx bytes;
#   - the consumers: make_desc and the A / B descriptors of the four k16 steps of a K tile
#     (start address, LBO, SBO, per operand major), the trans-a / trans-b immediates;
#   - the grouped tile order (blockIdx.x -> m0, n0), the mbarrier pipeline (stage, phase, parities,
#     who arrives where), and the epilogue (parking the f32 fragment in the ring, the read-back
#     loop, store_pair's alpha, bias, activation, pair stores and predicates).
# The hardware's side is modelled from its documentation, independently of the kernel:
#   - cuTensorMapEncodeTiled's argument rules (cuda.h, "Tensor Map Object Management");
#   - a TMA tile load: box element (i0, i1, i2) at byte offset ((i2 b1 + i1) b0 + i0) * 2 of the
#     destination, elements outside the tensor read as zero (OOB_FILL_NONE), the full box counted
#     in complete_tx, and CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk bits [4, 7) of the shared
#     address XORed with its 128-byte row bits [7, 10) (the pattern repeats every 1024 bytes, so
#     the destination must be 1024-byte aligned);
#   - a wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format": start, LBO, SBO
#     >> 4 in bits 0-13, 16-29, 32-45, base offset 49-51, layout 62-63 with 1 = 128B swizzle) and
#     the canonical 128B-swizzle layouts wgmma reads through it (PTX ISA "Shared Memory Matrix
#     Layout"; the same as CUTLASS's make_gmma_desc comments): K-major, element (mn, k) at
#     start + (mn % 8) 128 + (mn / 8) SBO + 2 k (LBO unused); MN-major (imm-trans = 1) at
#     start + 2 (mn % 64) + (mn / 64) LBO + (k % 8) 128 + (k / 8) SBO; then the same address
#     swizzle as TMA's (the base offset must be (start >> 7) & 7);
#   - the f32 accumulator fragment of wgmma m64nNk16 (PTX ISA "Register Fragments"): thread
#     T of the warp group, register i, holds row 16 (T / 32) + (T % 32) / 4 + 8 ((i % 4) / 2),
#     column 8 (i / 4) + 2 (T % 4) + i % 2;
#   - mbarrier phases (try_wait.parity p returns once the current phase's parity is not p) with
#     expect_tx / complete_tx, and wgmma groups retired by wait_group, under random schedules.
# Not modelled: rounding (the data are small integers and the sums exact in Python), timing,
# bank conflicts, register allocation (setmaxnreg), and anything the documentation leaves open;
# docs/gpu-owed.md says what only the GPU can show.
#
#   python3 tests/cuda/wgmma_gemm_emulate.py    (about 10 s; every line must say 0 bad)
import math
import operator
import random
import struct
import sys

ES = 2  # bytes per element: bf16 and f16 alike (the only dtypes of the kernel)
errors = []


def fail(msg):
    if len(errors) < 40:
        print("  ERROR:", msg)
    errors.append(msg)


# ============================ the kernel, copied from wgmma_gemm.cu ============================
kBM, kBK = 128, 64
kThreads = 384
TILES = {"wgmma_128x128x64": (128, 6), "wgmma_128x256x64": (256, 4)}  # BN, kStages
kAtomBytes = 1024
kMnBoxBytes = 64 * 128
kGroup = 16
kMaxDim = 2**31 - 1 - 512
kSimtTile = 16
ACT_NONE, ACT_RELU, ACT_GELU, ACT_GELU_TANH = 0, 1, 2, 3  # MmaAct


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


kGeluSqrt2OverPi = f32(0.7978845608028654)
kGeluInvSqrt2 = f32(0.7071067811865476)
kGeluCubic = f32(0.044715)


class Cfg:
    def __init__(self, name):
        self.name = name
        self.BN, self.S = TILES[name]
        self.kABytes = kBM * kBK * 2
        self.kBBytes = self.BN * kBK * 2
        self.kStageBytes = self.kABytes + self.kBBytes
        self.kBarBytes = 2 * self.S * 8
        self.kSmemBytes = self.S * self.kStageBytes + self.kBarBytes + 1024
        self.kAcc = self.BN // 2
        self.kLdPark = self.BN + 8
        assert 2 * 64 * self.kLdPark * 4 <= self.S * self.kStageBytes
        assert self.kABytes % 1024 == 0 and self.kBBytes % 1024 == 0
        assert self.BN % 64 == 0 and self.BN <= 256


def make_desc(addr, lbo, sbo):
    return (((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) |
            (((sbo & 0x3FFFF) >> 4) << 32) | (1 << 62))


class Operand:
    def __init__(self):
        self.inner = self.outer = self.ld = self.bstride = 0
        self.batch = 1
        self.box_inner, self.box_outer = kBK, 0


class Problem:  # GemmProblem
    def __init__(self, M, N, K, a_kmajor, b_kmajor, batch=1, sa=0, sb=0, bias=False, alpha=1.0):
        self.M, self.N, self.K = M, N, K
        self.a_kmajor, self.b_kmajor = a_kmajor, b_kmajor
        self.batch, self.sa, self.sb, self.bias, self.alpha = batch, sa, sb, bias, alpha


def plan(cfg, s):
    """WgPlan's constructor: (a_, b_, mt, nt), or a decline string."""
    if not s.K > 0:
        return "K = 0"
    a_row = s.K if s.a_kmajor else s.M
    b_row = s.K if s.b_kmajor else s.N
    if a_row % 8 != 0 or b_row % 8 != 0:
        return "rows not 16-byte multiples"
    if not (s.M <= kMaxDim and s.N <= kMaxDim and s.K <= kMaxDim and s.batch <= 65535 and
            (s.N + kSimtTile - 1) // kSimtTile <= 65535):
        return "too large"
    mt = (s.M + kBM - 1) // kBM
    nt = (s.N + cfg.BN - 1) // cfg.BN
    if mt * nt > 2**31 - 1:
        return "grid"
    a, b = Operand(), Operand()
    a.inner = a_row
    a.outer = s.M if s.a_kmajor else s.K
    a.box_outer = kBM if s.a_kmajor else 64
    b.inner = b_row
    b.outer = s.N if s.b_kmajor else s.K
    b.box_outer = cfg.BN if s.b_kmajor else 64
    for o in (a, b):
        o.ld = o.inner
    for o, stride in ((a, s.sa), (b, s.sb)):  # set_batch
        if stride != 0 and s.batch > 1:
            o.batch, o.bstride = s.batch, stride
        else:
            o.batch, o.bstride = 1, o.ld * o.outer
    if s.M > 0 and s.N > 0 and s.batch > 0:
        stand_in = 1 << 20
        if encode(a, stand_in) is None or encode(b, stand_in) is None:
            return "cuTensorMapEncodeTiled refuses"
    return a, b, mt, nt


def encode(o, ptr):
    """WgPlan::encode: the arguments of its cuTensorMapEncodeTiled call."""
    return encode_tiled(ES, 3, ptr, [o.inner, o.outer, o.batch], [o.ld * ES, o.bstride * ES],
                        [o.box_inner, o.box_outer, 1], [1, 1, 1], INTERLEAVE_NONE, SWIZZLE_128B,
                        OOB_FILL_NONE)


def tile_of(pid, mt, nt):
    per_group = kGroup * nt
    first_m = (pid // per_group) * kGroup
    group_m = mt - first_m if mt - first_m < kGroup else kGroup
    in_group = pid % per_group
    return (first_m + in_group % group_m) * kBM, (in_group // group_m)


def producer_loads(cfg, stage_a, stage_b, kt, m0, n0, za, zb, AK, BKM):
    """One K tile's TMA boxes: (dst, operand, c0, c1, c2)."""
    kc = kt * kBK
    loads = []
    if AK:
        loads.append((stage_a, "a", kc, m0, za))
    else:
        for j in range(kBM // 64):
            loads.append((stage_a + j * kMnBoxBytes, "a", m0 + 64 * j, kc, za))
    if BKM:
        loads.append((stage_b, "b", kc, n0, zb))
    else:
        for j in range(cfg.BN // 64):
            loads.append((stage_b + j * kMnBoxBytes, "b", n0 + 64 * j, kc, zb))
    return loads


def consumer_descs(stage_a, stage_b, cw, kk, AK, BKM):
    a_off = cw * 8192
    da = (make_desc(stage_a + a_off + 32 * kk, 16, kAtomBytes) if AK else
          make_desc(stage_a + a_off + 2048 * kk, kMnBoxBytes, kAtomBytes))
    db = (make_desc(stage_b + 32 * kk, 16, kAtomBytes) if BKM else
          make_desc(stage_b + 2048 * kk, kMnBoxBytes, kAtomBytes))
    return da, db, (0 if AK else 1), (0 if BKM else 1)  # wgmma_tile<T, BN, !AK, !BKM>


def activate(x, act):
    if act == ACT_RELU:
        return x if x > 0 else 0.0
    if act == ACT_GELU:
        return 0.5 * x * (1 + math.erf(x * kGeluInvSqrt2))
    if act == ACT_GELU_TANH:
        u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x)
        return 0.5 * x * (1 + math.tanh(u))
    return x


# ============================ the hardware, modelled from its documentation ============================
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B
OOB_FILL_NONE = 0  # zeros


def encode_tiled(es, rank, gaddr, dims, strides, box, estrides, interleave, swizzle, oob):
    """cuTensorMapEncodeTiled's rules (cuda.h): the map, or None if the driver would refuse."""
    ok = (1 <= rank <= 5 and gaddr % 16 == 0 and len(dims) == rank and len(strides) == rank - 1 and
          all(0 < d <= 2**32 for d in dims) and all(st % 16 == 0 and st < 2**40 for st in strides) and
          all(0 < b <= 256 for b in box) and (box[0] * es) % 16 == 0 and
          all(0 < e <= 8 for e in estrides) and interleave == INTERLEAVE_NONE)
    if swizzle == SWIZZLE_128B and box[0] * es > 128:
        ok = False
    if not ok:
        return None
    return {"es": es, "addr": gaddr, "dims": list(dims), "strides": list(strides), "box": list(box),
            "swizzle": swizzle, "oob": oob}


def swz128(addr):
    """The 128-byte swizzle on a shared address: chunk bits [4, 7) ^= row bits [7, 10)."""
    return addr ^ (((addr >> 7) & 7) << 4)


class Smem:
    """A block's dynamic shared memory, [raw, raw + size): one slot per 2-byte element."""

    def __init__(self, raw, size, data_end):
        self.raw, self.size, self.data_end = raw, size, data_end
        self.v = [None] * (size // 2)

    def write(self, addr, val):
        if not (self.raw <= addr < self.data_end) or addr % 2:
            fail("shared write at %#x outside the ring [%#x, %#x)" % (addr, self.raw, self.data_end))
            return
        self.v[(addr - self.raw) >> 1] = val

    def read(self, addr):
        if not (self.raw <= addr < self.data_end) or addr % 2:
            fail("shared read at %#x outside the ring" % addr)
            return 0
        return self.v[(addr - self.raw) >> 1]


def tma_load_3d(smem, dst, tmap, gmem, c0, c1, c2):
    """cp.async.bulk.tensor.3d global -> shared; returns the bytes it completes on the mbarrier."""
    es = tmap["es"]
    b0, b1, b2 = tmap["box"]
    d0, d1, d2 = tmap["dims"]
    st1, st2 = tmap["strides"][0] // es, tmap["strides"][1] // es
    if any(not (-2**31 <= c < 2**31) for c in (c0, c1, c2)):
        fail("TMA coordinate out of int32")
    if dst % 128:
        fail("TMA destination %#x not 128-byte aligned" % dst)
    if tmap["swizzle"] == SWIZZLE_128B:
        if dst % 1024:
            fail("128B-swizzled TMA destination %#x not 1024-byte aligned" % dst)
        if b0 * es != 128:
            fail("this model takes 128-byte box rows under the 128B swizzle")
    for i2 in range(b2):
        g2 = c2 + i2
        for i1 in range(b1):
            g1 = c1 + i1
            row_in = 0 <= g1 < d1 and 0 <= g2 < d2
            gbase = g1 * st1 + g2 * st2
            lin = dst + ((i2 * b1 + i1) * b0) * es
            for i0 in range(b0):
                g0 = c0 + i0
                if row_in and 0 <= g0 < d0:
                    idx = gbase + g0
                    if not 0 <= idx < len(gmem):
                        fail("TMA read outside the allocation")
                        val = 0
                    else:
                        val = gmem[idx]
                else:
                    val = 0  # out of bounds: zero fill
                a = lin + i0 * es
                smem.write(swz128(a) if tmap["swizzle"] == SWIZZLE_128B else a, val)
    return b0 * b1 * b2 * es


def decode_desc(d):
    return {"start": (d & 0x3FFF) << 4, "lbo": ((d >> 16) & 0x3FFF) << 4,
            "sbo": ((d >> 32) & 0x3FFF) << 4, "base": (d >> 49) & 7, "layout": (d >> 62) & 3,
            "junk": d & ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (7 << 49) | (3 << 62))}


def wgmma_operand(smem, desc, trans, rows):
    """What wgmma m64nNk16 reads through a descriptor: [mn][k], mn < rows, k < 16 (16-bit)."""
    f = decode_desc(desc)
    if f["layout"] != 1:
        fail("descriptor layout %d is not the 128B swizzle" % f["layout"])
    if f["junk"]:
        fail("descriptor has bits set outside its fields")
    start, lbo, sbo = f["start"], f["lbo"], f["sbo"]
    if f["base"] != (start >> 7) & 7:
        fail("descriptor base offset %d, the start address needs %d" % (f["base"], (start >> 7) & 7))
    out = []
    for mn in range(rows):
        if not trans:
            rb = start + (mn % 8) * 128 + (mn // 8) * sbo
            addrs = [rb + 2 * k for k in range(16)]
        else:
            cb = start + 2 * (mn % 64) + (mn // 64) * lbo
            addrs = [cb + (k % 8) * 128 + (k // 8) * sbo for k in range(16)]
        vals = []
        for a in addrs:
            v = smem.read(swz128(a))
            if v is None:
                fail("wgmma reads unwritten shared memory at %#x" % a)
                v = 0
            vals.append(v)
        out.append(vals)
    return out


def frag_rc(T, i):
    """wgmma m64nNk16 f32 accumulator: thread T (of 128), register i -> (row, col)."""
    lane = T % 32
    return 16 * (T // 32) + lane // 4 + 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


# ============================ one launch, block by block ============================
def reference(A, B, bias, s, act):
    Y = {}
    for z in range(s.batch):
        for r in range(s.M):
            ar = A[z][r]
            for c in range(s.N):
                v = s.alpha * sum(ar[k] * B[z][k][c] for k in range(s.K))
                if bias is not None:
                    v += bias[c]
                if act == ACT_RELU:
                    v = max(v, 0.0)
                elif act == ACT_GELU:
                    v = 0.5 * v * (1 + math.erf(v / math.sqrt(2)))
                elif act == ACT_GELU_TANH:
                    v = 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
                Y[(z, r, c)] = v
    return Y


def store(s, A, B, AK, BKM):
    """The operands as stored in global memory (storage order), with batch strides."""
    a_shared = s.sa == 0 or s.batch == 1
    b_shared = s.sb == 0 or s.batch == 1
    ga, gb = [], []
    for z in range(1 if a_shared else s.batch):
        ga += ([A[z][m][k] for m in range(s.M) for k in range(s.K)] if AK else
               [A[z][m][k] for k in range(s.K) for m in range(s.M)])
    for z in range(1 if b_shared else s.batch):
        gb += ([B[z][k][n] for n in range(s.N) for k in range(s.K)] if BKM else
               [B[z][k][n] for k in range(s.K) for n in range(s.N)])
    return ga, gb


def emulate(cfg, s, act, raw, seed, label):
    AK, BKM = s.a_kmajor, s.b_kmajor
    BN, S = cfg.BN, cfg.S
    rng = random.Random(seed)
    pl = plan(cfg, s)
    if isinstance(pl, str):
        fail("%s: the plan declines (%s)" % (label, pl))
        return
    a_, b_, mt, nt = pl
    a_shared = s.sa == 0 or s.batch == 1
    b_shared = s.sb == 0 or s.batch == 1
    A0 = [[[rng.randint(-9, 9) for _ in range(s.K)] for _ in range(s.M)]
          for _ in range(1 if a_shared else s.batch)]
    B0 = [[[rng.randint(-9, 9) for _ in range(s.N)] for _ in range(s.K)]
          for _ in range(1 if b_shared else s.batch)]
    A = [A0[0 if a_shared else z] for z in range(s.batch)]
    B = [B0[0 if b_shared else z] for z in range(s.batch)]
    bias = [rng.randint(-20, 20) for _ in range(s.N)] if s.bias else None
    if s.batch > 1:  # the strides the plan was given are the storage's
        assert a_shared or s.sa == s.M * s.K
        assert b_shared or s.sb == s.K * s.N
    ga, gb = store(s, A0, B0, AK, BKM)
    ptr_a, ptr_b, ptr_y = 1 << 24, 1 << 26, 1 << 28  # cudaMalloc'd: 16-byte aligned
    ma, mb = encode(a_, ptr_a), encode(b_, ptr_b)
    if ma is None or mb is None:
        fail("%s: cuTensorMapEncodeTiled refuses" % label)
        return
    maps = {"a": (ma, ga), "b": (mb, gb)}
    za_on = 1 if a_.batch > 1 else 0
    zb_on = 1 if b_.batch > 1 else 0
    pair = 1 if s.N % 2 == 0 and ptr_y % (2 * ES) == 0 else 0
    sy = s.M * s.N
    ktiles = (s.K + kBK - 1) // kBK
    Y = {}
    seen = set()
    op_bad = 0
    for z in range(s.batch):
        for pid in range(mt * nt):
            m0, nidx = tile_of(pid, mt, nt)
            n0 = nidx * BN
            if (z, m0, n0) in seen:
                fail("%s: tile (%d, %d) launched twice" % (label, m0, n0))
            seen.add((z, m0, n0))
            base = (raw + kAtomBytes - 1) & ~(kAtomBytes - 1)
            full0 = base + S * cfg.kStageBytes
            if full0 + 16 * S > raw + cfg.kSmemBytes or full0 % 8:
                fail("%s: the barriers pass the end of shared memory or are misaligned" % label)
            if raw + cfg.kSmemBytes > 1 << 18:
                fail("%s: shared addresses beyond the descriptor's 18 bits" % label)
            smem = Smem(raw, cfg.kSmemBytes, full0)
            D = [[[0] * BN for _ in range(64)] for _ in range(2)]
            st = 0
            for kt in range(ktiles):
                stage_a = base + st * cfg.kStageBytes
                stage_b = stage_a + cfg.kABytes
                got = 0
                for dst, which, c0, c1, c2 in producer_loads(cfg, stage_a, stage_b, kt, m0, n0,
                                                              z * za_on, z * zb_on, AK, BKM):
                    got += tma_load_3d(smem, dst, maps[which][0], maps[which][1], c0, c1, c2)
                if got != cfg.kStageBytes:
                    fail("%s: expect_tx %d bytes, the boxes complete %d" % (label, cfg.kStageBytes, got))
                for cw in range(2):
                    arows = [[] for _ in range(64)]
                    bcols = [[] for _ in range(BN)]
                    for kk in range(kBK // 16):
                        da, db, ta, tb = consumer_descs(stage_a, stage_b, cw, kk, AK, BKM)
                        for r, v in zip(arows, wgmma_operand(smem, da, ta, 64)):
                            r += v
                        for c, v in zip(bcols, wgmma_operand(smem, db, tb, BN)):
                            c += v
                    # What the operands must be: A rows m0 + 64 cw + m, B columns n0 + n, K from
                    # kt * 64, zero outside the tensor.
                    for m in range(64):
                        gm = m0 + 64 * cw + m
                        want = [A[z][gm][k] if gm < s.M and k < s.K else 0
                                for k in range(kt * kBK, kt * kBK + kBK)]
                        if arows[m] != want:
                            op_bad += 1
                    for n in range(BN):
                        gn = n0 + n
                        want = [B[z][k][gn] if gn < s.N and k < s.K else 0
                                for k in range(kt * kBK, kt * kBK + kBK)]
                        if bcols[n] != want:
                            op_bad += 1
                    Dc = D[cw]
                    for m in range(64):
                        ar, drow = arows[m], Dc[m]
                        if not any(ar):
                            continue
                        for n in range(BN):
                            drow[n] += sum(map(operator.mul, ar, bcols[n]))
                st = st + 1 if st + 1 < S else 0
            # The accumulator fragments, then the epilogue as the kernel runs it.
            park = {}  # float index from wgmma_smem -> (value, cw, warp)
            park_lo, park_hi = (base - raw) // 4, (full0 - raw) // 4
            for cw in range(2):
                park0 = (base - raw) // 4 + cw * 64 * cfg.kLdPark
                for warp in range(4):
                    for lane in range(32):
                        T = 32 * warp + lane
                        acc = [0] * cfg.kAcc
                        for i in range(cfg.kAcc):
                            r, c = frag_rc(T, i)
                            acc[i] = D[cw][r][c]
                        g, t = lane >> 2, lane & 3
                        for h in range(2):
                            prow = park0 + (16 * warp + g + 8 * h) * cfg.kLdPark + 2 * t
                            for i in range(BN // 8):
                                at = prow + 8 * i
                                if (raw + 4 * at) % 8:
                                    fail("%s: float2 park store misaligned" % label)
                                for e in range(2):
                                    if not park_lo <= at + e < park_hi:
                                        fail("%s: park outside the ring" % label)
                                    if at + e in park:
                                        fail("%s: two threads park at one slot" % label)
                                    park[at + e] = (acc[4 * i + 2 * h + e], cw, warp)
            for cw in range(2):
                park0 = (base - raw) // 4 + cw * 64 * cfg.kLdPark
                for warp in range(4):
                    kPairs = BN // 2
                    for lane in range(32):
                        for idx in range(lane, 16 * kPairs, 32):
                            rl, c = 16 * warp + idx // kPairs, 2 * (idx % kPairs)
                            row, col = m0 + 64 * cw + rl, n0 + c
                            if row < s.M and col < s.N:
                                at = park0 + rl * cfg.kLdPark + c
                                if (raw + 4 * at) % 8:
                                    fail("%s: float2 park load misaligned" % label)
                                vv = []
                                for e in range(2):
                                    val, pcw, pwarp = park.get(at + e, (None, None, None))
                                    if val is None or (pcw, pwarp) != (cw, warp):
                                        fail("%s: read-back of a slot this warp did not write" % label)
                                        val = 0
                                    vv.append(val)
                                store_pair(s, Y, z * sy, bias, row, col, vv[0], vv[1], act, pair,
                                           ptr_y, label)
    ref = reference(A, B, bias, s, act)
    bad = 0
    for key, want in ref.items():
        got = Y.get(key)
        exact = act in (ACT_NONE, ACT_RELU)
        if got is None or (got != want if exact else abs(got - want) > 1e-5 * max(1.0, abs(want))):
            if bad < 5:
                print("  mismatch at (z, row, col) = %s: got %s, want %s" % (key, got, want))
            bad += 1
    if len(Y) != len(ref):
        fail("%s: %d outputs written, %d expected" % (label, len(Y), len(ref)))
    print("%-18s %-6s %-5s M %4d N %4d K %4d batch %d%s%s%s act %d: %d bad outputs, %d bad operand "
          "rows/columns" % (cfg.name, "A K" if AK else "A M", "B K" if BKM else "B N", s.M, s.N, s.K,
                            s.batch, " (a shared)" if s.batch > 1 and a_shared else "",
                            " (b shared)" if s.batch > 1 and b_shared else "",
                            " bias" if s.bias else "", act, bad, op_bad),
          flush=True)
    if bad or op_bad:
        errors.append(label)


def store_pair(s, Y, yoff, bias, row, col, v0, v1, act, pair, ptr_y, label):
    two = col + 1 < s.N
    v0 *= s.alpha
    v1 *= s.alpha
    if bias is not None:
        v0 += bias[col]
        if two:
            v1 += bias[col + 1]
    v0 = activate(v0, act)
    v1 = activate(v1, act)
    out = yoff + row * s.N + col
    z = yoff // (s.M * s.N) if s.M * s.N else 0
    outs = [(out, v0)] + ([(out + 1, v1)] if two else [])
    if two and pair and (ptr_y + ES * out) % (2 * ES):
        fail("%s: paired store misaligned" % label)
    for o, v in outs:
        if not 0 <= o < s.batch * s.M * s.N:
            fail("%s: store outside y" % label)
            continue
        key = (o // (s.M * s.N), (o % (s.M * s.N)) // s.N, o % s.N)
        if key[0] != z:
            fail("%s: store into another batch entry" % label)
        if key in Y:
            fail("%s: output %s stored twice" % (label, key))
        Y[key] = v


# ============================ the mbarrier pipeline, under random schedules ============================
class MBar:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self):
        if self.pending <= 0:
            fail("mbarrier: more arrivals than its count")
        self.pending -= 1
        self._maybe_complete()

    def arrive_expect_tx(self, nbytes):
        if not 0 <= nbytes < 2**20:
            fail("mbarrier: expect_tx %d bytes outside the tx-count range" % nbytes)
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        if self.tx < 0:
            fail("mbarrier: complete_tx past the expected bytes")
        self._maybe_complete()

    def ready(self, parity):  # try_wait.parity
        return (self.phase & 1) != parity


def pipeline(cfg, ktiles, rng):
    S = cfg.S
    full = [MBar(1) for _ in range(S)]   # mbar_init(full, 1)
    empty = [MBar(8) for _ in range(S)]  # mbar_init(empty, 8)
    landed = [None] * S      # the tile whose bytes a stage holds (all boxes landed)
    issued = [None] * S      # the tile the stage's latest TMA writes
    in_flight = []           # TMA boxes: (stage, tile, bytes)
    groups = {w: [] for w in range(8)}  # each consumer warp's uncompleted wgmma groups

    def box_bytes():
        return [cfg.kStageBytes // 2, cfg.kStageBytes - cfg.kStageBytes // 2]

    def producer():
        st, phase = 0, 0
        for kt in range(ktiles):
            while not empty[st].ready(phase ^ 1):
                yield "wait"
            full[st].arrive_expect_tx(cfg.kStageBytes)
            for w, gs in groups.items():
                if any(g[0] == st for g in gs):
                    fail("pipeline: TMA of tile %d into stage %d while warp %d's wgmma on it runs"
                         % (kt, st, w))
            issued[st] = kt
            landed[st] = None
            for b in box_bytes():
                in_flight.append((st, kt, b))
            yield "step"
            st += 1
            if st == S:
                st, phase = 0, phase ^ 1

    def retire(w, keep):
        while len(groups[w]) > keep:
            g_st, g_kt = groups[w].pop(0)
            if landed[g_st] != g_kt or issued[g_st] != g_kt:
                fail("pipeline: warp %d's wgmma on tile %d read stage %d holding tile %s"
                     % (w, g_kt, g_st, issued[g_st]))

    def consumer(w):
        st, prev, phase = 0, S - 1, 0
        for kt in range(ktiles):
            while not full[st].ready(phase):
                yield "wait"
            if landed[st] != kt:
                fail("pipeline: warp %d passed full[%d] for tile %d, the stage holds %s"
                     % (w, st, kt, landed[st]))
            groups[w].append((st, kt))  # wgmma ... commit_group
            yield "step"
            retire(w, 1)  # wait_group 1 (may complete any time before; checked here, the latest)
            if kt > 0:
                empty[prev].arrive()  # lane 0 of each consumer warp
            prev = st
            st += 1
            if st == S:
                st, phase = 0, phase ^ 1
            yield "step"
        retire(w, 0)
        done.add(w)
        while len(done) < 8:  # bar.sync 1, 256
            yield "wait"
        if in_flight:
            fail("pipeline: the epilogue parks in the ring while a TMA is in flight")

    done = set()
    actors = [producer()] + [consumer(w) for w in range(8)]
    live = list(range(len(actors)))
    stalls = 0
    while live or in_flight:
        choices = live + (["tma"] if in_flight else [])
        pick = rng.choice(choices)
        if pick == "tma":
            i = rng.randrange(len(in_flight))
            st, kt, b = in_flight.pop(i)
            if not any(x[0] == st and x[1] == kt for x in in_flight):
                landed[st] = kt
            full[st].complete_tx(b)
            stalls = 0
            continue
        try:
            r = next(actors[pick])
            stalls = stalls + 1 if r == "wait" else 0
        except StopIteration:
            live.remove(pick)
            stalls = 0
        if stalls > 5000:
            fail("pipeline: deadlock (S %d, %d K tiles)" % (S, ktiles))
            return False
    return True


# ============================ the runs ============================
def main():
    random.seed(7)
    # The tile order: a bijection from blockIdx.x onto the (M, N) tiles.
    order_bad = 0
    for mt in list(range(1, 40)) + [100, 257]:
        for nt in (1, 2, 3, 7, 16, 33):
            got = {tile_of(pid, mt, nt) for pid in range(mt * nt)}
            want = {(m * kBM, n) for m in range(mt) for n in range(nt)}
            if got != want:
                order_bad += 1
    print("grouped tile order over 246 grids: %d bad" % order_bad)
    if order_bad:
        errors.append("tile order")

    # Creation accepts every GEMM whose rows are 16-byte multiples, and the driver takes its maps.
    refused = 0
    for name in TILES:
        cfg = Cfg(name)
        for AK in (True, False):
            for BKM in (True, False):
                for M, N, K in ((8, 8, 8), (1, 8, 8), (8, 1, 8), (8, 8, 1), (136, 72, 72),
                                (4096, 4096, 4096), (1000, 1000, 1000), (128, 10, 256),
                                (2**31 - 600, 8, 8), (8, 8, 2**31 - 600)):
                    for batch, sa, sb in ((1, 0, 0), (3, M * K, 0), (3, 0, K * N), (3, M * K, K * N)):
                        s = Problem(M, N, K, AK, BKM, batch, sa, sb)
                        a_row = K if AK else M
                        b_row = K if BKM else N
                        pl = plan(cfg, s)
                        if a_row % 8 == 0 and b_row % 8 == 0 and isinstance(pl, str):
                            refused += 1
                            print("  declined:", name, AK, BKM, M, N, K, batch, pl)
    # The largest dimensions creation takes: the last tile's TMA coordinates stay in int32.
    for name in TILES:
        cfg = Cfg(name)
        for AK in (True, False):
            for BKM in (True, False):
                big = kMaxDim // 8 * 8
                # (N is bounded by the fallback's grid y; each operand below 32 GiB.)
                for M, N, K in ((big, 8, 8), (8, 8, big), (8, 65535 * kSimtTile, 8)):
                    pl = plan(cfg, Problem(M, N, K, AK, BKM))
                    if isinstance(pl, str):
                        refused += 1
                        print("  declined:", name, AK, BKM, M, N, K, pl)
                        continue
                    _, _, mt, nt = pl
                    m0, nidx = tile_of(mt * nt - 1, mt, nt)
                    ktiles = (K + kBK - 1) // kBK
                    for _, _, c0, c1, c2 in producer_loads(cfg, 0, 0, ktiles - 1, m0,
                                                           nidx * cfg.BN, 0, 0, AK, BKM):
                        if not all(-2**31 <= c < 2**31 for c in (c0, c1, c2)):
                            refused += 1
                            print("  TMA coordinates beyond int32:", name, AK, BKM, M, N, K)
    print("shapes creation takes: tensor maps the driver accepts, int32 TMA coordinates: %d bad"
          % refused)
    if refused:
        errors.append("encode")

    # The pipeline: no deadlock, no stage refilled under a running wgmma, no stale stage read.
    prng = random.Random(11)
    runs = 0
    before = len(errors)
    for name in TILES:
        cfg = Cfg(name)
        for ktiles in (1, 2, cfg.S - 1, cfg.S, cfg.S + 1, 2 * cfg.S + 3, 5 * cfg.S):
            for _ in range(12):
                pipeline(cfg, ktiles, prng)
                runs += 1
    print("mbarrier pipeline: %d random schedules, %d errors" % (runs, len(errors) - before))

    # Whole launches, every block, both tiles, every operand major; ragged M, N, K; edge tiles
    # whose MN-major boxes lie wholly outside the tensor; odd N (single stores); batches with
    # one operand shared; bias, alpha, every activation.
    seed = 100
    for name in TILES:
        cfg = Cfg(name)
        BN = cfg.BN
        raws = (0, 16 * 37)  # the dynamic shared memory's start: aligned, and not
        for AK in (True, False):
            for BKM in (True, False):
                shapes = [Problem(136, BN + 72, 72, AK, BKM, bias=True, alpha=2.0)]
                if not AK and not BKM:
                    shapes.append(Problem(64, 64, 67, AK, BKM))        # K not a multiple of 8
                    shapes.append(Problem(8, 8, 5, AK, BKM, bias=True))  # one tiny tile
                if AK and BKM:
                    shapes.append(Problem(40, 65, 200, AK, BKM, bias=True))  # odd N, 4 K tiles
                if not AK:
                    shapes.append(Problem(72, 24, 16, AK, BKM, batch=2, sa=72 * 16, sb=0))
                if not BKM:
                    shapes.append(Problem(24, 72, 16, AK, BKM, batch=2, sa=0, sb=16 * 72))
                for i, s in enumerate(shapes):
                    act = (seed + i) % 4
                    emulate(cfg, s, act, raws[(seed + i) % 2], seed,
                            "%s A%s B%s #%d" % (name, "K" if AK else "M", "K" if BKM else "N", i))
                    seed += 1

    if errors:
        print("FAILED: %d errors" % len(errors))
        return 1
    print("all layouts match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
