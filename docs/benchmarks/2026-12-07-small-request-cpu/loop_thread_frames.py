import sys, re, collections
path=sys.argv[1]; thread=sys.argv[2] if len(sys.argv)>2 else "MainThread"
incl=collections.Counter(); self_=collections.Counter(); total=0; skipped=collections.Counter()
for line in open(path):
    line=line.rstrip("\n")
    if not line: continue
    stack,_,n=line.rpartition(" "); n=int(n)
    frames=stack.split(";")
    if thread not in frames[0]: continue
    leaf=frames[-1]
    if leaf.startswith(("sched_yield","epoll_pwait")):
        skipped[leaf.split()[0]]+=n; continue
    total+=n
    py=[f for f in frames[1:] if "(streamrt" in f or ".py" in f]
    seen=set()
    for f in py:
        key=re.sub(r":\d+\)$",")",f)
        if key in seen: continue
        seen.add(key); incl[key]+=n
    self_[re.sub(r":\d+\)$",")",py[-1]) if py else leaf]+=n
print("skipped",dict(skipped),"counted",total)
print("--- inclusive (python functions)")
for k,v in incl.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 60): print(f"{v:6d} {100*v/total:5.1f}% {k}")
print("--- innermost python frame")
for k,v in self_.most_common(40): print(f"{v:6d} {100*v/total:5.1f}% {k}")
