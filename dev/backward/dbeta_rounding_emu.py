"""dbeta_rounding_emu.py - which bf16 rounding sites dominate the CUDA backward's dbeta error: the chunk
equations of dev/backward/README.md (section 1) in float64 torch for one head and five chunks, with bf16
rounding switched on one site at a time (S, W = beta X, T, dS', Pm, dVn, dU, Vn), each run's dbeta against
the run with every site off. "gfix": every site on, but bwd_grad's K dS' and T^T dVn exact (the hi + lo
operands of sm90_chunk_bwd.cuh). "allR": every site on, dbeta taken as dU . Vn / beta (the residual form;
not better). CPU only:

    python3 dev/backward/dbeta_rounding_emu.py
"""
import torch
torch.manual_seed(0)
D=torch.float64
def rb(x, on): return x.bfloat16().double() if on else x
C=64; K=V=128; NC=5
def run(fl, seed=0):
    g_=torch.Generator().manual_seed(seed)
    T=C*NC
    q=torch.randn(T,K,generator=g_,dtype=D); k=torch.randn(T,K,generator=g_,dtype=D)
    v=torch.randn(T,V,generator=g_,dtype=D); do=torch.randn(T,V,generator=g_,dtype=D)
    x=torch.randn(T,generator=g_,dtype=D); g=-torch.log1p(torch.exp(-(x+2)))
    beta=torch.rand(T,generator=g_,dtype=D)
    h0=0.5*torch.randn(K,V,generator=g_,dtype=D); dht=torch.randn(K,V,generator=g_,dtype=D)
    q=q.bfloat16().double(); k=k.bfloat16().double(); v=v.bfloat16().double(); do=do.bfloat16().double(); beta=beta.bfloat16().double()
    rq=1/torch.sqrt((q*q).sum(-1)+1e-6); rk=1/torch.sqrt((k*k).sum(-1)+1e-6)
    scale=K**-0.5
    recs=[]
    for c in range(NC):
        sl=slice(c*C,(c+1)*C)
        G=torch.cumsum(g[sl],0); gam=torch.exp(G); gC=torch.exp(G[-1]); gu=torch.exp(G[-1]-G)
        Dm=torch.exp(G[:,None]-G[None,:]); Dl=torch.tril(Dm,-1); Mi=torch.tril(Dm)
        K_=k[sl]; Q_=q[sl]
        B=(rk[sl][:,None]*rk[sl][None,:])*(K_@K_.T)*Dl
        A=beta[sl][:,None]*B
        Tm=torch.linalg.inv(torch.eye(C,dtype=D)+A)
        Pm=scale*(rq[sl][:,None]*rk[sl][None,:])*(Q_@K_.T)*Mi
        recs.append(dict(G=G,gam=gam,gC=gC,gu=gu,Dl=Dl,Mi=Mi,B=B,A=A,Tm=Tm,Pm=Pm,ck=rk[sl]*gam,cq=scale*rq[sl]*gam,cu=rk[sl]*gu,K=K_,Q=Q_,V=v[sl],dO=do[sl],beta=beta[sl],rk=rk[sl],rq=rq[sl]))
    # forward chain (f64 state, bf16 operand S)
    S=h0.clone(); Ss=[]
    for r in recs:
        Sb=rb(S,fl['S']); Ss.append(Sb)
        X=r['V']-r['ck'][:,None]*(r['K']@Sb)
        W=rb(r['beta'][:,None]*X,fl['W'])
        Vn=rb(r['Tm'],fl['T'])@W
        S=r['gC']*S+r['K'].T@rb(r['cu'][:,None]*Vn,fl['W'])
    dS=dht.clone(); dSs=[None]*NC; dSx=[None]*NC
    for c in reversed(range(NC)):
        r=recs[c]; dSb=rb(dS,fl['dS']); dSs[c]=dSb; dSx[c]=dS.clone()
        dVn=r['cu'][:,None]*(r['K']@dSb)+rb(r['Pm'],fl['Pm']).T@r['dO']
        dU=rb(r['Tm'],fl['T']).T@rb(dVn,fl['dVn'])
        dX=r['beta'][:,None]*dU
        dS=r['gC']*dS+r['Q'].T@rb(r['cq'][:,None]*r['dO'],fl['W'])-r['K'].T@rb(r['ck'][:,None]*dX,fl['W'])
    dbs=[]
    for c in range(NC):
        r=recs[c]; Sb=Ss[c]; dSb=dSs[c] if not fl.get('gfix') else dSx[c]
        X=r['V']-r['ck'][:,None]*(r['K']@Sb)
        W=rb(r['beta'][:,None]*X,fl['W'])
        Vn=rb(r['Tm'],fl['T'])@W
        dVn=r['cu'][:,None]*(r['K']@dSb)+rb(r['Pm'],fl['Pm']).T@r['dO']
        dU=rb(r['Tm'],fl['T']).T@rb(dVn,fl['dVn'] and not fl.get('gfix'))
        dA=-torch.tril(rb(dU,fl['dU'])@rb(Vn,fl['Vn']).T,-1)
        db=(dU*X).sum(-1)+(dA*r['B']).sum(-1)
        if fl.get('R'):
            R=Vn/r['beta'][:,None]
            db=(dU*R).sum(-1)
        dbs.append(db)
    return torch.cat(dbs)
names=['S','W','T','dS','Pm','dVn','dU','Vn']
off={n:False for n in names}
for seed in range(2):
    ref=run(off,seed)
    def err(fl):
        d=run(fl,seed); return ((d-ref).norm()/ref.norm()).item()
    print('seed',seed,'all', '%.2e'%err({n:True for n in names}), 'allR', '%.2e'%err(dict({n:True for n in names},R=True)))
    print('  gfix', '%.2e'%err(dict({n:True for n in names},gfix=True)))
    for n in names:
        print('  ',n,'%.2e'%err(dict(off,**{n:True})))
