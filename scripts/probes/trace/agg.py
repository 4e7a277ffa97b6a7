"""Issue 42 probe: inclusive sample share per frame of py-spy raw (collapsed) profiles.
usage: python3 scripts/probes/trace/agg.py A.raw [B.raw ...]"""
import sys, collections
def load(f):
    incl=collections.Counter(); total=0
    for line in open(f):
        stack, _, n = line.rstrip().rpartition(' ')
        n=int(n); total+=n
        frames=stack.split(';')
        seen=set()
        for fr in frames:
            key=fr.split(' (')[0]+' ('+fr.split('/')[-1] if '/' in fr else fr
            if key not in seen: incl[key]+=n; seen.add(key)
    return incl, total
for f in sys.argv[1:]:
    incl, total = load(f)
    print('==', f, total)
    for k,v in incl.most_common(60):
        if 'sglang_pd' in k or 'event_loop' in k or 'forward' in k or 'idle' in k.lower() or 'sleep' in k:
            print(f'{100*v/total:5.1f}% {k[:150]}')
