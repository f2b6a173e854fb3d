#!/bin/bash
# usage: threads.sh grpc|http tag [src]
proto=$1; tag=$2; src=$3
cd /work/main
if [ -n "$src" ]; then export PYTHONPATH=$src; fi
.venv/bin/python -m streamrt.cli.main serve /tmp/prof/repo --http-port 18000 --grpc-port 18001 --metrics-port -1 --log-level WARNING --grpc-server h2corn > /tmp/prof/server-$tag.log 2>&1 &
pid=$!
unset PYTHONPATH
for i in $(seq 60); do curl -sf localhost:18000/v2/health/ready >/dev/null && break; sleep 0.5; done
port=18001; [ $proto = http ] && port=18000
build/perf_analyzer/perf_analyzer -m null_small -u 127.0.0.1:$port -i $proto -b 1 --concurrency-range 16 --measurement-interval 2000 > /dev/null 2>&1
snap() { for t in /proc/$pid/task/*; do n=$(cat $t/comm); [ $(basename $t) = $pid ] && n=loop; echo "$n $(awk "{print \$14+\$15}" $t/stat)"; done | awk '{a[$1]+=$2} END {for (k in a) print k, a[k]}' | sort; }
snap > /tmp/prof/t0-$tag; s0=$(curl -s localhost:18000/v2/models/null_small/stats)
build/perf_analyzer/perf_analyzer -m null_small -u 127.0.0.1:$port -i $proto -b 1 --concurrency-range 16 --measurement-interval 4000 > /tmp/prof/pa-$tag.txt 2>&1
snap > /tmp/prof/t1-$tag; s1=$(curl -s localhost:18000/v2/models/null_small/stats)
kill $pid; wait $pid
python3 - "$s0" "$s1" /tmp/prof/t0-$tag /tmp/prof/t1-$tag <<'PY'
import json,sys
a=json.loads(sys.argv[1])["model_stats"][0]; b=json.loads(sys.argv[2])["model_stats"][0]
n=b["inference_count"]-a["inference_count"]; e=b["execution_count"]-a["execution_count"]
t0=dict(l.rsplit(" ",1) for l in open(sys.argv[3]).read().split("\n") if l); t1=dict(l.rsplit(" ",1) for l in open(sys.argv[4]).read().split("\n") if l)
print(f"requests {n} executions {e} rows/exec {n/e:.2f}")
tot=0
for k in sorted(t1):
    d=(int(t1[k])-int(t0.get(k,0)))*10000/n; tot+=d
    if d>1: print(f"  {k:30s} {d:7.1f} us/req")
print(f"  total {tot:.1f} us/req")
PY
grep -E "Throughput" /tmp/prof/pa-$tag.txt | tail -1
