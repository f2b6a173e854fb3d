import asyncio, time, grpc, h2corn, statistics, sys
walls={"start":[], "body":[], "trailers":[]}; cpus={"start":[], "body":[], "trailers":[]}
BODY = b"\0\0\0\0\x40" + b"x"*64
async def app(scope, receive, send):
    if scope["type"]!="http": return
    await receive()
    for key, m in (("start",{"type":"http.response.start","status":200,"trailers":True,"headers":[(b"content-type",b"application/grpc")]}),
              ("body",{"type":"http.response.body","body":BODY,"more_body":False}),
              ("trailers",{"type":"http.response.trailers","headers":[(b"grpc-status",b"0")],"more_trailers":False})):
        a=time.perf_counter_ns(); c=time.thread_time_ns()
        await send(m)
        walls[key].append((time.perf_counter_ns()-a)/1e3); cpus[key].append((time.thread_time_ns()-c)/1e3)
async def main(threads):
    cfg=h2corn.Config(bind=("127.0.0.1:50998",),grpc=True,http1=False,access_log=False,lifespan="off",workers=1,runtime_threads=threads)
    server=h2corn.Server(app,cfg)
    task=asyncio.create_task(server.serve()); await server.wait_started()
    import os, threading
    me=threading.get_native_id()
    names={}
    for t in os.listdir('/proc/self/task'):
        names[int(t)]=open(f'/proc/self/task/{t}/comm').read().strip()
    print(names)
    if BATCH:
        for tid,n in names.items():
            if tid!=me and ('tokio' in n or 'h2corn' in n):
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0)); print('batch', tid, n)
    def client():
        ch=grpc.insecure_channel("127.0.0.1:50998")
        f=ch.unary_unary("/x.Y/Z",request_serializer=lambda b:b,response_deserializer=lambda b:b)
        for i in range(2000): f(b"hello")
    await asyncio.to_thread(client)
    server.shutdown(); await asyncio.wait({task},timeout=3)
BATCH=int(sys.argv[2]) if len(sys.argv)>2 else 0
asyncio.run(main(int(sys.argv[1])))
for k in walls:
    w=sorted(walls[k][200:]); c=sorted(cpus[k][200:])
    print(k, "wall p50 %.1f p90 %.1f us; cpu p50 %.1f p90 %.1f"%(w[len(w)//2], w[int(len(w)*.9)], c[len(c)//2], c[int(len(c)*.9)]))
