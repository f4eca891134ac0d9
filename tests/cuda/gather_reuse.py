#!/usr/bin/env python3
# A model, not a measurement: per block of an implicit-GEMM convolution tile, the bytes its
# gathered operand copies over all of K against the bytes of the distinct activation pixels they
# touch (what an L1 that kept them would fetch from L2 once). Rows are the kernels' own order:
# pixel by pixel (n, oh, ow), or window by window (m = 4·q + tap) for the pool epilogues.
# docs/kernels.md, "Gathered activations through L1". Usage: python3 tests/cuda/gather_reuse.py

def rows_pixels(N,OH,OW,m0,BM,pool):
    out=[]
    for m in range(m0,m0+BM):
        if pool:
            PH,PW=OH//2,OW//2
            q,t=m>>2,m&3
            n=q//(PH*PW); r=q-n*PH*PW
            if n>=N: continue
            ph,pw=divmod(r,PW); out.append((n,2*ph+(t>>1),2*pw+(t&1)))
        else:
            n=m//(OH*OW)
            if n>=N: continue
            p=m-n*OH*OW; out.append((n,p//OW,p%OW))
    return out
def model(name,N,H,W,C,KH,KW,pad,BM,pool,blocks=64):
    OH,OW=H+2*pad-KH+1,W+2*pad-KW+1
    M=N*OH*OW
    tot=uniq=0
    step=max(1,(M//BM)//blocks)
    for b in range(0,M//BM,step):
        pix=rows_pixels(N,OH,OW,b*BM,BM,pool)
        s=set(); g=0
        for (n,oh,ow) in pix:
            for kh in range(KH):
                for kw in range(KW):
                    ih,iw=oh-pad+kh,ow-pad+kw
                    if 0<=ih<H and 0<=iw<W:
                        g+=1; s.add((n,ih,iw))
        tot+=g; uniq+=len(s)
    print(f"{name:48s} BM={BM:3d} gathered/unique pixels = {tot/uniq:4.2f}  unique per block {uniq/ (len(range(0,M//BM,step)))*C*2/1024:5.1f} KiB (16-bit)")
# convnet: conv2 fwd (x: 32 ch, 28x28, pooled epilogue), conv3 fwd (64 ch, 14x14, pooled)
for BM in (64,128,256):
    model("convnet conv2 fwd (x 32ch 28x28, pool rows)",1024,28,28,32,3,3,1,BM,True)
    model("convnet conv2 dgrad (dy 64ch 28x28)",1024,28,28,64,3,3,1,BM,False)
    model("convnet conv3 fwd (x 64ch 14x14, pool rows)",1024,14,14,64,3,3,1,BM,True)
    model("convnet conv3 dgrad (dy 128ch 14x14)",1024,14,14,128,3,3,1,BM,False)
    model("simplecnn conv2 fwd (x 16ch 13x13 -> 11x11)",128,13,13,16,3,3,0,BM,False)
