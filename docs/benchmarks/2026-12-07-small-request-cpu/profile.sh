#!/bin/bash
# usage: run.sh grpc|http tag
proto=$1; tag=$2
cd /work/main
.venv/bin/python -m streamrt.cli.main serve /tmp/prof/repo --http-port 18000 --grpc-port 18001 --metrics-port -1 --log-level WARNING --grpc-server h2corn > /tmp/prof/server-$tag.log 2>&1 &
pid=$!
for i in $(seq 60); do curl -sf localhost:18000/v2/health/ready >/dev/null && break; sleep 0.5; done
port=18001; [ $proto = http ] && port=18000
build/perf_analyzer/perf_analyzer -m null_small -u 127.0.0.1:$port -i $proto -b 1 --concurrency-range 16 --measurement-interval 3000 > /dev/null 2>&1
.venv/bin/py-spy record --native -r 200 --pid $pid --format raw --threads -o /tmp/prof/spy-$tag.txt -d 12 > /tmp/prof/spy-$tag.log 2>&1 &
spy=$!
build/perf_analyzer/perf_analyzer -m null_small -u 127.0.0.1:$port -i $proto -b 1 --concurrency-range 16 --measurement-interval 4000 > /tmp/prof/pa-$tag.txt 2>&1
wait $spy
kill $pid; wait $pid
grep -E "Throughput|Avg latency" /tmp/prof/pa-$tag.txt | tail -3
