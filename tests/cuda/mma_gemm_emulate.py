# A CPU emulation of one block of plugins/cuda/ops/mma_gemm.cu's mma_gemm_kernel, written to check its
# index math without a GPU: the cp.async tile copies (with zero fill at the edges), the ldmatrix
# address patterns and what ldmatrix (.trans or not) hands each lane, the mma.sync m16n8k16 and
# m16n8k8 (TF32) fragment layouts as the PTX ISA gives them, and the epilogue's output mapping,
# for every tile, dtype width and operand layout, on ragged edge blocks, with integer data so the
# result must be exact. The formulas are copied by hand from the kernel: change both together.
#
#   python3 tests/cuda/mma_gemm_emulate.py    (a few seconds; prints 0 bad elements per line)
import itertools
import random
import sys

def run(BM, BN, BK, WM_, WN_, f32, AK, BKM, M, N, K, m0=0, n0=0, split=None):
    padK = 4 if f32 else 8; padMN = 8
    ldK = BK + padK; ldM = BM + padMN; ldN = BN + padMN
    vec = 4 if f32 else 8
    threads = WM_ * WN_ * 32
    WM = BM // WM_; WN = BN // WN_; MI = WM // 16; NI = WN // 8
    stepK = 8 if f32 else 16
    # global matrices: logical A (M,K), B (K,N); stored
    Ag = [[random.randint(-3, 3) for _ in range(K)] for _ in range(M)]
    Bg = [[random.randint(-3, 3) for _ in range(N)] for _ in range(K)]
    if AK: a_store, lda = [Ag[m][k] for m in range(M) for k in range(K)], K
    else: a_store, lda = [Ag[m][k] for k in range(K) for m in range(M)], M
    if BKM: b_store, ldb = [Bg[k][n] for n in range(N) for k in range(K)], K
    else: b_store, ldb = [Bg[k][n] for k in range(K) for n in range(N)], N

    def load_tile(Rows, Cols, Lds, g, ld, row0, rows, col0, cols):
        s = [None] * (Rows * Lds)
        per = Cols // vec; total = Rows * per
        for tid in range(threads):
            for it in range((total + threads - 1) // threads):
                c = tid + it * threads
                if c >= total: continue
                r = c // per; cc = (c % per) * vec
                gr = row0 + r; gc = col0 + cc
                valid = gr < rows and gc < cols
                for e in range(vec):
                    s[r * Lds + cc + e] = g[gr * ld + gc + e] if valid else 0
        return s

    acc = {}  # (warp, mi, ni, lane) -> [4]
    k_begin, k_end = 0, K
    ktiles = (k_end - k_begin + BK - 1) // BK
    for kt in range(ktiles):
        k0 = k_begin + kt * BK
        if AK: sA = load_tile(BM, BK, ldK, a_store, lda, m0, M, k0, K)
        else: sA = load_tile(BK, BM, ldM, a_store, lda, k0, K, m0, M)
        if BKM: sB = load_tile(BN, BK, ldK, b_store, ldb, n0, N, k0, K)
        else: sB = load_tile(BK, BN, ldN, b_store, ldb, k0, K, n0, N)
        for warp in range(WM_ * WN_):
            warp_m = warp % WM_; warp_n = warp // WM_
            for kk in range(0, BK, stepK):
                af = {}; bf = {}
                if not f32:
                    def ldm(addrs, s, trans):
                        regs = {}
                        for lane in range(32):
                            g, t = lane // 4, lane % 4
                            for j in range(4):
                                rows = [addrs[8 * j + r] for r in range(8)]
                                for rr in rows: assert s[rr + 7] is not None and s[rr] is not None
                                Mj = [[s[rows[r] + c] for c in range(8)] for r in range(8)]
                                if not trans: regs[(lane, j)] = (Mj[g][2 * t], Mj[g][2 * t + 1])
                                else: regs[(lane, j)] = (Mj[2 * t][g], Mj[2 * t + 1][g])
                        return regs
                    for mi in range(MI):
                        r0 = warp_m * WM + mi * 16
                        addrs = []
                        for lane in range(32):
                            if AK: addrs.append((r0 + (lane & 15)) * ldK + kk + (lane >> 4) * 8)
                            else: addrs.append((kk + (lane & 7) + (lane >> 4) * 8) * ldM + r0 + ((lane >> 3) & 1) * 8)
                        regs = ldm(addrs, sA, not AK)
                        for lane in range(32): af[(mi, lane)] = [regs[(lane, j)] for j in range(4)]
                    for nj in range(NI // 2):
                        c0 = warp_n * WN + nj * 16
                        addrs = []
                        for lane in range(32):
                            if BKM: addrs.append((c0 + (lane & 7) + (lane >> 4) * 8) * ldK + kk + ((lane >> 3) & 1) * 8)
                            else: addrs.append((kk + (lane & 7) + ((lane >> 3) & 1) * 8) * ldN + c0 + (lane >> 4) * 8)
                        regs = ldm(addrs, sB, not BKM)
                        for lane in range(32):
                            bf[(2 * nj, lane)] = [regs[(lane, 0)], regs[(lane, 1)]]
                            bf[(2 * nj + 1, lane)] = [regs[(lane, 2)], regs[(lane, 3)]]
                    for mi in range(MI):
                        for ni in range(NI):
                            A = [[None] * 16 for _ in range(16)]; B = [[None] * 8 for _ in range(16)]
                            for lane in range(32):
                                g, t = lane // 4, lane % 4
                                a = af[(mi, lane)]
                                A[g][2*t], A[g][2*t+1] = a[0]; A[g+8][2*t], A[g+8][2*t+1] = a[1]
                                A[g][2*t+8], A[g][2*t+9] = a[2]; A[g+8][2*t+8], A[g+8][2*t+9] = a[3]
                                b = bf[(ni, lane)]
                                B[2*t][g], B[2*t+1][g] = b[0]; B[2*t+8][g], B[2*t+9][g] = b[1]
                            D = [[sum(A[i][k] * B[k][j] for k in range(16)) for j in range(8)] for i in range(16)]
                            for lane in range(32):
                                g, t = lane // 4, lane % 4
                                c = acc.setdefault((warp, mi, ni, lane), [0, 0, 0, 0])
                                c[0] += D[g][2*t]; c[1] += D[g][2*t+1]; c[2] += D[g+8][2*t]; c[3] += D[g+8][2*t+1]
                else:
                    a_at = (lambda m, k: sA[m * ldK + k]) if AK else (lambda m, k: sA[k * ldM + m])
                    b_at = (lambda n, k: sB[n * ldK + k]) if BKM else (lambda n, k: sB[k * ldN + n])
                    for mi in range(MI):
                        for ni in range(NI):
                            A = [[None] * 8 for _ in range(16)]; B = [[None] * 8 for _ in range(8)]
                            for lane in range(32):
                                g, t = lane // 4, lane % 4
                                r = warp_m * WM + mi * 16 + g
                                a = [a_at(r, kk + t), a_at(r + 8, kk + t), a_at(r, kk + t + 4), a_at(r + 8, kk + t + 4)]
                                A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4] = a
                                cc = warp_n * WN + ni * 8 + g
                                B[t][g], B[t+4][g] = b_at(cc, kk + t), b_at(cc, kk + t + 4)
                            D = [[sum(A[i][k] * B[k][j] for k in range(8)) for j in range(8)] for i in range(16)]
                            for lane in range(32):
                                g, t = lane // 4, lane % 4
                                c = acc.setdefault((warp, mi, ni, lane), [0, 0, 0, 0])
                                c[0] += D[g][2*t]; c[1] += D[g][2*t+1]; c[2] += D[g+8][2*t]; c[3] += D[g+8][2*t+1]
    Y = {}
    for warp in range(WM_ * WN_):
        warp_m = warp % WM_; warp_n = warp // WM_
        for mi in range(MI):
            for h in range(2):
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    row = m0 + warp_m * WM + mi * 16 + g + 8 * h
                    if row >= M: continue
                    for ni in range(NI):
                        col = n0 + warp_n * WN + ni * 8 + 2 * t
                        if col >= N: continue
                        c = acc.get((warp, mi, ni, lane), [0, 0, 0, 0])
                        for e in range(2):
                            if col + e < N:
                                assert (row, col + e) not in Y
                                Y[(row, col + e)] = c[2 * h + e]
    bad = 0
    for r in range(m0, min(M, m0 + BM)):
        for c in range(n0, min(N, n0 + BN)):
            ref = sum(Ag[r][k] * Bg[k][c] for k in range(K))
            if Y.get((r, c)) != ref: bad += 1
    assert len(Y) == (min(M, m0 + BM) - m0) * (min(N, n0 + BN) - n0)
    return bad

random.seed(1)
failed = False
tiles = {"large": (128, 128, 32, 2, 4), "mid": (64, 64, 32, 2, 2), "small": (32, 32, 64, 2, 2)}
for name, (BM, BN, BK, wm, wn) in tiles.items():
    for f32 in (False, True):
        for AK, BKM in itertools.product((True, False), repeat=2):
            vec = 4 if f32 else 8
            # ragged: a block at the edge
            M = BM + (BM // 2) + vec  # second block partially filled
            N = BN + (BN // 4) + vec
            K = BK + vec * 3
            bad = run(BM, BN, BK, wm, wn, f32, AK, BKM, M, N, K, m0=BM, n0=BN)
            bad0 = run(BM, BN, BK, wm, wn, f32, AK, BKM, M, N, K, m0=0, n0=0)
            print(name, "f32" if f32 else "16", "AK" if AK else "AM", "BK" if BKM else "BN", "bad", bad, bad0, flush=True)
            failed = failed or bad or bad0
sys.exit(1 if failed else 0)
