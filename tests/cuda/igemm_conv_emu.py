# A pure-Python emulation of plugins/cuda/ops/igemm_conv.cu's index math, for reviewing it without
# a GPU: the copy assignment and its predicates (padding, ragged M, O, K, the weight gradient's
# pixels), ldmatrix and ldmatrix.trans lane addressing, the mma.sync m16n8k16 fragment layouts
# (PTX ISA, "Matrix Fragments for mma.m16n8k16"), the pipeline's stage indices, the epilogue's
# stores in NCHW and NHWC, the backward-data filter staging and the split-K slices and their
# reduction. Small integer data, so every sum is exact and compared for equality with a direct
# convolution. It mirrors the CUDA source by hand: change both together.
#
#   python3 tests/cuda/igemm_conv_emu.py [fwd|bd|bw|fwd2|bw2|all]   (about a minute for all)
#
# Not a ctest (it tests the transcription, not the compiled kernels); the [cuda] tests in
# test_igemm_conv.cpp are the real check.
import random, sys, itertools

def ldmatrix(read, trans):
    # read(l, e): element e (0..7) of the 8-element row that lane l addresses. Register j of
    # lane l gets row l/4, columns 2(l%4), +1 of matrix j (rows from lanes 8j..8j+7), or with
    # .trans rows 2(l%4), +1 of column l/4.
    regs = [[None]*4 for _ in range(32)]
    for j in range(4):
        rows = [[read(8*j + r, e) for e in range(8)] for r in range(8)]
        for l in range(32):
            g, t = l // 4, l % 4
            if not trans:
                regs[l][j] = (rows[g][2*t], rows[g][2*t+1])
            else:
                regs[l][j] = (rows[2*t][g], rows[2*t+1][g])
    return regs

def mma(acc, a, b):
    # acc[l][4], a[l][4] pairs, b[l][2] pairs (per lane)
    A = [[0]*16 for _ in range(16)]
    B = [[0]*8 for _ in range(16)]
    for l in range(32):
        g, t = l // 4, l % 4
        for i, (r, c) in enumerate([(g, 2*t), (g+8, 2*t), (g, 2*t+8), (g+8, 2*t+8)]):
            A[r][c], A[r][c+1] = a[l][i]
        for i in range(2):
            k = 2*t + 8*i
            B[k][g], B[k+1][g] = b[l][i]
    for l in range(32):
        g, t = l // 4, l % 4
        for i in range(4):
            r = g + (8 if i >= 2 else 0)
            c = 2*t + (i % 2)
            acc[l][i] += sum(A[r][k]*B[k][c] for k in range(16))

class TL:
    def __init__(s, BM, BN, BK, WM, WN, ST):
        s.BM, s.BN, s.BK, s.WM, s.WN, s.STAGES = BM, BN, BK, WM, WN, ST
        s.WARPS_M, s.WARPS_N = BM//WM, BN//WN
        s.THREADS = 32*s.WARPS_M*s.WARPS_N
        s.MI, s.NI = WM//16, WN//8
        s.LDS = BK + 8
        s.CPR = BK // 8
        s.A_ITERS = BM*s.CPR//s.THREADS
        s.B_ITERS = BN*s.CPR//s.THREADS

def fwd_kernel(tl, a, x, w, bias, y, relu=False):
    """x: flat NHWC list, w: flat (O, K) list, y: dict index->value"""
    M, O, K = a['M'], a['O'], a['K']
    gx = (M + tl.BM - 1)//tl.BM; gy = (O + tl.BN - 1)//tl.BN
    KT = (K + tl.BK - 1)//tl.BK
    for bx in range(gx):
        for by in range(gy):
            m0, n0 = bx*tl.BM, by*tl.BN
            As = [[[None]*tl.LDS for _ in range(tl.BM)] for _ in range(tl.STAGES)]
            Bs = [[[None]*tl.LDS for _ in range(tl.BN)] for _ in range(tl.STAGES)]
            krs = tl.THREADS // tl.CPR
            thr = []
            for tid in range(tl.THREADS):
                ccol, crow = tid % tl.CPR, tid // tl.CPR
                info = []
                for i in range(tl.A_ITERS):
                    m = m0 + crow + i*krs
                    if m < M:
                        n = m // a['OHW']; p = m - n*a['OHW']; oh = p // a['OW']; ow = p - oh*a['OW']
                        info.append((n*a['H']*a['W']*a['C'], oh*a['sh']-a['ph'], ow*a['sw']-a['pw'], True))
                    else:
                        info.append((0, 0, 0, False))
                thr.append((ccol, crow, info))
            def load(st, kt):
                for tid in range(tl.THREADS):
                    ccol, crow, info = thr[tid]
                    k = kt*tl.BK + ccol*8
                    kin = k < K
                    c = kh = kw = 0
                    if kin:
                        tap = k // a['C']; c = k - tap*a['C']; kh = tap // a['KW']; kw = tap - kh*a['KW']
                    for i in range(tl.A_ITERS):
                        row = crow + i*krs
                        base, ih0, iw0, v = info[i]
                        ih, iw = ih0 + kh, iw0 + kw
                        ok = kin and v and 0 <= ih < a['H'] and 0 <= iw < a['W']
                        for e in range(8):
                            As[st][row][ccol*8+e] = x[base + (ih*a['W'] + iw)*a['C'] + c + e] if ok else 0
                    for i in range(tl.B_ITERS):
                        row = crow + i*krs
                        o = n0 + row
                        ok = kin and o < O
                        for e in range(8):
                            Bs[st][row][ccol*8+e] = w[o*K + k + e] if ok else 0
            accs = {}
            for warp in range(tl.THREADS//32):
                accs[warp] = [[[[0.0]*4 for _ in range(32)] for _ in range(tl.NI)] for _ in range(tl.MI)]
            for s_ in range(tl.STAGES-1):
                if s_ < KT: load(s_, s_)
            for kt in range(KT):
                nxt = kt + tl.STAGES - 1
                if nxt < KT: load(nxt % tl.STAGES, nxt)
                st = kt % tl.STAGES
                for warp in range(tl.THREADS//32):
                    wm, wn = warp % tl.WARPS_M, warp // tl.WARPS_M
                    for kk in range(0, tl.BK, 16):
                        af = []
                        for i in range(tl.MI):
                            def rd(l, e, i=i):
                                a_row = wm*tl.WM + (l & 15); a_col = (l >> 4)*8
                                return As[st][a_row + i*16][kk + a_col + e]
                            af.append(ldmatrix(rd, False))
                        bf = [None]*tl.NI
                        for j in range(0, tl.NI, 2):
                            def rd(l, e, j=j):
                                b_row = wn*tl.WN + (l & 7) + ((l >> 4) << 3); b_col = ((l >> 3) & 1)*8
                                return Bs[st][b_row + j*8][kk + b_col + e]
                            r = ldmatrix(rd, False)
                            bf[j] = [(r[l][0], r[l][1]) for l in range(32)]
                            bf[j+1] = [(r[l][2], r[l][3]) for l in range(32)]
                        for i in range(tl.MI):
                            for j in range(tl.NI):
                                mma(accs[warp][i][j], af[i], bf[j])
            for warp in range(tl.THREADS//32):
                wm, wn = warp % tl.WARPS_M, warp // tl.WARPS_M
                for l in range(32):
                    for i in range(tl.MI):
                        for h in range(2):
                            m = m0 + wm*tl.WM + i*16 + (l >> 2) + h*8
                            if m >= M: continue
                            n = m // a['OHW']; p = m - n*a['OHW']
                            rowb = n*a['y_n'] + p*a['y_p']
                            for j in range(tl.NI):
                                o = n0 + wn*tl.WN + j*8 + (l & 3)*2
                                if o >= O: continue
                                for e in range(2):
                                    if o + e >= O: continue
                                    v = accs[warp][i][j][l][h*2+e] + (bias[o+e] if bias else 0)
                                    if relu and v < 0: v = 0
                                    idx = rowb + (o+e)*a['y_c']
                                    assert idx not in y, "double write"
                                    y[idx] = v

def wgrad_kernel(tl, a, dy, x, part, S):
    BM, BN, BK = tl.BM, tl.BN, tl.BK
    LDA, LDB = BM + 8, BN + 8
    CA, CB = BM//8, BN//8
    AI, BI = BK*CA//tl.THREADS, BK*CB//tl.THREADS
    assert AI*tl.THREADS == BK*CA and BI*tl.THREADS == BK*CB
    O, J, P = a['O'], a['J'], a['P']
    KT = (P + BK - 1)//BK
    for bx in range((O + BM - 1)//BM):
        for by in range((J + BN - 1)//BN):
            for bz in range(S):
                m0, n0 = bx*BM, by*BN
                kt0 = bz*a['kt_per']; kt1 = min(KT, kt0 + a['kt_per']); nk = kt1 - kt0
                assert nk > 0
                As = [[[None]*LDA for _ in range(BK)] for _ in range(tl.STAGES)]
                Bs = [[[None]*LDB for _ in range(BK)] for _ in range(tl.STAGES)]
                def load(st, kt):
                    for tid in range(tl.THREADS):
                        a_ccol, a_crow = tid % CA, tid // CA
                        b_ccol, b_crow = tid % CB, tid // CB
                        oa = m0 + a_ccol*8; oin = oa < O
                        jb = n0 + b_ccol*8; jin = jb < J
                        bc = bkh = bkw = 0
                        if jin:
                            tap = jb // a['C']; bc = jb - tap*a['C']; bkh = tap // a['KW']; bkw = tap - bkh*a['KW']
                        for i in range(AI):
                            r = a_crow + i*(tl.THREADS//CA); p = kt*BK + r
                            ok = oin and p < P
                            for e in range(8):
                                As[st][r][a_ccol*8+e] = dy[p*O + oa + e] if ok else 0
                        for i in range(BI):
                            r = b_crow + i*(tl.THREADS//CB); p = kt*BK + r
                            ok = jin and p < P
                            src = None
                            if ok:
                                n = p // a['OHW']; q = p - n*a['OHW']; oh = q // a['OW']; ow = q - oh*a['OW']
                                ih = oh*a['sh'] - a['ph'] + bkh; iw = ow*a['sw'] - a['pw'] + bkw
                                ok = 0 <= ih < a['H'] and 0 <= iw < a['W']
                                if ok: src = ((n*a['H'] + ih)*a['W'] + iw)*a['C'] + bc
                            for e in range(8):
                                Bs[st][r][b_ccol*8+e] = x[src + e] if ok else 0
                accs = {wp: [[[[0.0]*4 for _ in range(32)] for _ in range(tl.NI)] for _ in range(tl.MI)] for wp in range(tl.THREADS//32)}
                for s_ in range(tl.STAGES-1):
                    if s_ < nk: load(s_, kt0 + s_)
                for it in range(nk):
                    nxt = it + tl.STAGES - 1
                    if nxt < nk: load(nxt % tl.STAGES, kt0 + nxt)
                    st = it % tl.STAGES
                    for warp in range(tl.THREADS//32):
                        wm, wn = warp % tl.WARPS_M, warp // tl.WARPS_M
                        for kk in range(0, BK, 16):
                            af = []
                            for i in range(tl.MI):
                                def rd(l, e, i=i):
                                    a_k = (l & 7) + ((l >> 4) << 3); a_m = wm*tl.WM + ((l >> 3) & 1)*8
                                    return As[st][kk + a_k][a_m + i*16 + e]
                                af.append(ldmatrix(rd, True))
                            bf = [None]*tl.NI
                            for j in range(0, tl.NI, 2):
                                def rd(l, e, j=j):
                                    b_k = (l & 7) + ((l >> 3) & 1)*8; b_n = wn*tl.WN + ((l >> 4) << 3)
                                    return Bs[st][kk + b_k][b_n + j*8 + e]
                                r = ldmatrix(rd, True)
                                bf[j] = [(r[l][0], r[l][1]) for l in range(32)]
                                bf[j+1] = [(r[l][2], r[l][3]) for l in range(32)]
                            for i in range(tl.MI):
                                for j in range(tl.NI):
                                    mma(accs[warp][i][j], af[i], bf[j])
                for warp in range(tl.THREADS//32):
                    wm, wn = warp % tl.WARPS_M, warp // tl.WARPS_M
                    for l in range(32):
                        for i in range(tl.MI):
                            for h in range(2):
                                o = m0 + wm*tl.WM + i*16 + (l >> 2) + h*8
                                if o >= O: continue
                                for j in range(tl.NI):
                                    jj = n0 + wn*tl.WN + j*8 + (l & 3)*2
                                    if jj >= J: continue
                                    for e in range(2):
                                        idx = (bz*O + o)*J + jj + e
                                        assert idx not in part
                                        part[idx] = accs[warp][i][j][l][h*2+e]

def conv_ref(N, C, H, W, O, KH, KW, sh, sw, ph, pw, x4, w4, b):
    OH = (H + 2*ph - KH)//sh + 1; OW = (W + 2*pw - KW)//sw + 1
    y = {}
    for n, o, oh, ow in itertools.product(range(N), range(O), range(OH), range(OW)):
        s = b[o] if b else 0
        for c, kh, kw in itertools.product(range(C), range(KH), range(KW)):
            ih, iw = oh*sh - ph + kh, ow*sw - pw + kw
            if 0 <= ih < H and 0 <= iw < W:
                s += x4[n][c][ih][iw]*w4[o][c][kh][kw]
        y[(n, o, oh, ow)] = s
    return y, OH, OW

def rnd4(a, b, c, d):
    return [[[[random.randint(-3, 3) for _ in range(d)] for _ in range(c)] for _ in range(b)] for _ in range(a)]

def test_fwd(tl, N, C, H, W, O, KH, KW, sh, sw, ph, pw, nhwc_out, bias=True):
    x4 = rnd4(N, C, H, W); w4 = rnd4(O, C, KH, KW); b = [random.randint(-3, 3) for _ in range(O)] if bias else None
    ref, OH, OW = conv_ref(N, C, H, W, O, KH, KW, sh, sw, ph, pw, x4, w4, b)
    x = [x4[n][c][h][ww] for n in range(N) for h in range(H) for ww in range(W) for c in range(C)]
    w = [w4[o][c][kh][kw] for o in range(O) for kh in range(KH) for kw in range(KW) for c in range(C)]
    K = KH*KW*C
    if nhwc_out: yn, yc, yp = OH*OW*O, 1, O
    else: yn, yc, yp = O*OH*OW, OH*OW, 1
    a = dict(H=H, W=W, C=C, O=O, KH=KH, KW=KW, OW=OW, sh=sh, sw=sw, ph=ph, pw=pw, K=K, M=N*OH*OW, OHW=OH*OW, y_n=yn, y_c=yc, y_p=yp)
    y = {}
    fwd_kernel(tl, a, x, w, b, y)
    assert len(y) == N*O*OH*OW, (len(y), N*O*OH*OW)
    for (n, o, oh, ow), v in ref.items():
        got = y[n*yn + o*yc + (oh*OW + ow)*yp]
        assert got == v, ((n, o, oh, ow), got, v)

def test_bwd_data(tl, N, C, H, W, O, KH, KW, ph, pw):
    # dx = conv(dy, w') stride 1, padding KH-1-ph
    OH = H + 2*ph - KH + 1; OW = W + 2*pw - KW + 1
    dy4 = rnd4(N, O, OH, OW); w4 = rnd4(O, C, KH, KW)
    # reference dx
    ref = {}
    for n, c, ih, iw in itertools.product(range(N), range(C), range(H), range(W)):
        s = 0
        for o, kh, kw in itertools.product(range(O), range(KH), range(KW)):
            oh, ow = ih + ph - kh, iw + pw - kw
            if 0 <= oh < OH and 0 <= ow < OW: s += dy4[n][o][oh][ow]*w4[o][c][kh][kw]
        ref[(n, c, ih, iw)] = s
    x = [dy4[n][o][h][ww] for n in range(N) for h in range(OH) for ww in range(OW) for o in range(O)]
    # staged filter: out[c, kh, kw, o] = w[o, c, KH-1-kh, KW-1-kw] via the stage kernel's index math
    Co, Ca = C, O
    s0, s1, s2, s3 = C*KH*KW, KH*KW, KW, 1
    wflat = [w4[o][c][kh][kw] for o in range(O) for c in range(C) for kh in range(KH) for kw in range(KW)]
    total = Co*KH*KW*Ca
    ws = [None]*total
    for i in range(total):
        r = i; ca = r % Ca; r //= Ca; kw = r % KW; r //= KW; kh = r % KH; co = r // KH
        ws[i] = wflat[ca*s0 + co*s1 + (KH-1-kh)*s2 + (KW-1-kw)*s3]
    pph, ppw = KH-1-ph, KW-1-pw
    K = KH*KW*Ca
    a = dict(H=OH, W=OW, C=Ca, O=Co, KH=KH, KW=KW, OW=W, sh=1, sw=1, ph=pph, pw=ppw, K=K, M=N*H*W, OHW=H*W, y_n=C*H*W, y_c=H*W, y_p=1)
    y = {}
    fwd_kernel(tl, a, x, ws, None, y)
    for (n, c, ih, iw), v in ref.items():
        got = y[n*C*H*W + c*H*W + ih*W + iw]
        assert got == v, ((n, c, ih, iw), got, v)

def test_wgrad(tl, N, C, H, W, O, KH, KW, sh, sw, ph, pw, S_target, nhwc_w):
    OH = (H + 2*ph - KH)//sh + 1; OW = (W + 2*pw - KW)//sw + 1
    dy4 = rnd4(N, O, OH, OW); x4 = rnd4(N, C, H, W)
    ref = {}
    for o, c, kh, kw in itertools.product(range(O), range(C), range(KH), range(KW)):
        s = 0
        for n, oh, ow in itertools.product(range(N), range(OH), range(OW)):
            ih, iw = oh*sh - ph + kh, ow*sw - pw + kw
            if 0 <= ih < H and 0 <= iw < W: s += dy4[n][o][oh][ow]*x4[n][c][ih][iw]
        ref[(o, c, kh, kw)] = s
    dy = [dy4[n][o][h][ww] for n in range(N) for h in range(OH) for ww in range(OW) for o in range(O)]
    x = [x4[n][c][h][ww] for n in range(N) for h in range(H) for ww in range(W) for c in range(C)]
    P = N*OH*OW; J = KH*KW*C
    KT = (P + tl.BK - 1)//tl.BK
    slices = max(1, min(S_target, max(1, KT//4)))
    kt_per = (KT + slices - 1)//slices
    slices = (KT + kt_per - 1)//kt_per
    a = dict(H=H, W=W, C=C, O=O, KW=KW, OW=OW, sh=sh, sw=sw, ph=ph, pw=pw, J=J, P=P, OHW=OH*OW, kt_per=kt_per)
    part = {}
    wgrad_kernel(tl, a, dy, x, part, slices)
    assert len(part) == slices*O*J
    total = O*J
    dw = {}
    for i in range(total):
        s = sum(part[z*total + i] for z in range(slices))
        dst = i
        if not nhwc_w:
            o = i // J; j = i - o*J; tap = j // C; c = j - tap*C
            dst = o*J + c*KH*KW + tap
        dw[dst] = s
    for (o, c, kh, kw), v in ref.items():
        idx = ((o*KH + kh)*KW + kw)*C + c if nhwc_w else ((o*C + c)*KH + kh)*KW + kw
        assert dw[idx] == v, ((o, c, kh, kw), dw[idx], v)
    return slices

random.seed(1)
tiles = [TL(128, 128, 32, 64, 32, 3), TL(128, 64, 32, 64, 32, 3), TL(64, 64, 32, 32, 32, 4), TL(128, 32, 32, 32, 32, 3)]
which = sys.argv[1] if len(sys.argv) > 1 else "all"
for tl in tiles:
    name = f"{tl.BM}x{tl.BN}"
    if which in ("all", "fwd"):
        test_fwd(tl, 2, 16, 5, 6, 20, 3, 3, 1, 1, 1, 1, True)
        test_fwd(tl, 1, 8, 7, 5, 10, 3, 2, 2, 1, 2, 0, False)
        test_fwd(tl, 3, 24, 4, 4, 8, 1, 1, 1, 1, 0, 0, False, bias=False)
        print(name, "fwd ok", flush=True)
    if which in ("all", "bd"):
        test_bwd_data(tl, 2, 10, 5, 4, 16, 3, 3, 1, 0)
        print(name, "bwd data ok", flush=True)
    if which in ("all", "bw"):
        s = test_wgrad(tl, 2, 8, 9, 7, 16, 3, 3, 1, 1, 1, 1, 3, False)
        s2 = test_wgrad(tl, 3, 16, 6, 5, 8, 2, 3, 2, 1, 0, 2, 2, True)
        print(name, "wgrad ok, slices", s, s2, flush=True)
if which in ("all", "bw2"):
    for tl in tiles:
        s = test_wgrad(tl, 8, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, 3, False)
        print(tl.BM, tl.BN, "wgrad slices", s, flush=True)
if which in ("all", "fwd2"):
    # M spanning several blocks, O spanning several, K tail
    for tl in tiles:
        test_fwd(tl, 3, 16, 9, 10, 136, 3, 3, 1, 1, 1, 1, True)
        print(tl.BM, tl.BN, "fwd2 ok", flush=True)
