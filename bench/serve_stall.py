# SPDX-License-Identifier: MIT
"""serve_stall.py - how long `tollgate serve` keeps its clients waiting while
its store is stuck: 1,000 sequential TG.HIT on new keys (each needs the
store) while a stopped process holds a shared segment's table lock
(--shm; the holder is tests/serve/shm_holder), then while the Redis server
is stopped with SIGSTOP (--redis). Prints the seconds the 1,000 took and how
many answers were degraded (the failure policy's). Default options: the
waits are --lock-timeout-ms 20 and --redis-timeout-ms 100, then a back-off.

usage: python3 bench/serve_stall.py PATH/TO/tollgate PATH/TO/shm_holder
(python3's redis module and redis-server needed; servers on loopback ports,
all stopped at the end)
"""
import os, signal, socket, subprocess, sys, tempfile, time
import redis
TG, HOLDER = sys.argv[1], sys.argv[2]

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def serve(*opts):
    port = free_port()
    p = subprocess.Popen([TG, "serve", "--port", str(port), *opts], stdout=subprocess.PIPE)
    while True:
        line = p.stdout.readline().decode()
        if "ready" in line or not line:
            break
    return p, port

def timed(port, n=1000):
    r = redis.Redis(port=port, socket_timeout=60)
    t = time.monotonic(); deg = 0
    for i in range(n):
        deg += r.execute_command("TG.HIT", "new%d" % i, "fixed_window", 10, 60000)[5]
    el = time.monotonic() - t
    r.close()
    return el, deg

name = "/tg-stall-%d" % os.getpid()
srv, port = serve("--shm", name)
h = subprocess.Popen([HOLDER, name + ".fixed_window", "fixed_window", "65536", "1024"], stdout=subprocess.PIPE)
assert h.stdout.readline().strip() == b"held"
el, deg = timed(port)
print("shm_lock_held_by_stopped_process requests=1000 seconds=%.3f ms_per_request=%.3f degraded=%d" % (el, el, deg))
os.kill(h.pid, signal.SIGCONT); h.wait()
srv.terminate(); srv.wait()
for a in ("fixed_window", "fixed_window_per_key", "sliding_window", "token_bucket", "leaky_bucket"):
    try: os.unlink("/dev/shm" + name + "." + a)
    except FileNotFoundError: pass

d = tempfile.mkdtemp()
rport = free_port()
rs = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d], stdout=subprocess.DEVNULL)
for _ in range(100):
    try:
        redis.Redis(port=rport).ping(); break
    except Exception: time.sleep(0.05)
srv, port = serve("--redis", "127.0.0.1:%d" % rport)
timed(port, 10)
os.kill(rs.pid, signal.SIGSTOP)
el, deg = timed(port)
print("redis_stopped requests=1000 seconds=%.3f ms_per_request=%.3f degraded=%d" % (el, el, deg))
os.kill(rs.pid, signal.SIGCONT)
srv.terminate(); srv.wait(); rs.terminate(); rs.wait()
