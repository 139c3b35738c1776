# Which 8-bit map for the 1-bit allreduce's error feedback (issue 48, item 3;
# docs/COMMUNICATOR.md section 5b): simulate W=2 workers' worker-error feedback
# (numpy, fp32) on momentum-like inputs whose coordinate scales are
# log-normal with sigma = argv[1], keep the worker error in each format (fp32,
# bf16, 8-bit blocks of 256 on the linear map k/127 or on the signed dynamic
# map of shared/golden/qmaps.json), and measure (1) the relative quantization
# error of the error per call, (2) the relative bias of the running mean of
# the outputs against the true mean after T calls (what the feedback is there
# to remove). Usage: python3 bench/comm/error_map_choice.py 1.0
import json, os, sys
import numpy as np
_here = os.path.dirname(os.path.abspath(__file__))
_maps = [os.environ.get('LOWBIT_QMAPS', ''), os.path.join(_here, '../../shared/golden/qmaps.json'),
         os.path.join(_here, '../../../../shared/golden/qmaps.json')]
m=json.load(open(next(p for p in _maps if p and os.path.exists(p))))['maps']['signed_dynamic_8bit']
dyn=np.array(m if isinstance(m,list) else m['values'],dtype=np.float32); dyn.sort()
def q_lin(e,B=256):
    e=e.reshape(-1,B); a=np.abs(e).max(1,keepdims=True); a[a==0]=1
    c=np.rint(e/a*127); return (c*a/127).ravel().astype(np.float32)
def q_dyn(e,B=256):
    e=e.reshape(-1,B); a=np.abs(e).max(1,keepdims=True); a[a==0]=1
    r=e/a; i=np.clip(np.searchsorted(dyn,r),1,255); lo=dyn[i-1]; hi=dyn[i]
    v=np.where(np.abs(r-lo)<=np.abs(hi-r),lo,hi); return (v*a).ravel().astype(np.float32)
def bf16(e):
    u=e.astype(np.float32).view(np.uint32); u=((u+0x7FFF+((u>>16)&1))>>16)<<16; return u.view(np.float32)
rng=np.random.default_rng(0); n=1<<16; W=2; T=200
scale=np.exp(rng.normal(0,float(sys.argv[1]),n)).astype(np.float32)  # per-coordinate magnitudes (heavy tail)
base=rng.normal(0,1,n).astype(np.float32)*scale
for name,q in [('fp32',lambda e:e),('bf16',bf16),('lin8',q_lin),('dyn8',q_dyn)]:
    e=[np.zeros(n,np.float32) for _ in range(W)]; acc=np.zeros(n); tru=np.zeros(n); qerr=[]
    g_state=[base.copy() for _ in range(W)]
    r2=np.random.default_rng(1)
    for t in range(T):
        outs=[]
        for j in range(W):
            g_state[j]=0.9*g_state[j]+0.1*(base+r2.normal(0,1,n).astype(np.float32)*scale)
            x=g_state[j]+e[j]; s=np.sqrt(np.mean(x.astype(np.float64)**2)); o=np.where(x>=0,s,-s).astype(np.float32)
            ne=x-o; qe=q(ne); qerr.append(np.linalg.norm(qe-ne)/np.linalg.norm(ne)); e[j]=qe; outs.append(o)
        acc+=np.mean(outs,0); tru+=np.mean(g_state,0)
    bias=np.linalg.norm(acc/T-tru/T)/np.linalg.norm(tru/T)
    print(f"{name}: rel quant err of e {np.mean(qerr):.4f}, rel bias of running mean after {T} calls {bias:.4f}")
