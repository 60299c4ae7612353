# SPDX-License-Identifier: MIT
"""ngx.py - runs Debian's real nginx with the tollgate module for the tests,
and always stops it.

Nginx(http, workers=2) writes a configuration into a private prefix (a
temporary directory: its pid file, logs, temporary paths and document root),
loads the module into it, listens on a free loopback port, starts
`nginx -p PREFIX -c PREFIX/nginx.conf` in the foreground (daemon off) and
waits until it answers. stop() asks the master to quit (SIGQUIT, then
SIGTERM, then SIGKILL for it and any worker left); every nginx still
running when the interpreter exits is stopped the same way, so a failing
test leaves no server behind. check(http) runs `nginx -t` on a
configuration without starting anything.

The paths come from the environment: TG_NGINX (the nginx binary) and
TG_NGINX_MODULE (ngx_http_tollgate_module.so), as CTest passes them.
"""
import atexit
import http.client
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

NGINX = os.environ.get("TG_NGINX", "/usr/sbin/nginx")
MODULE = os.environ.get("TG_NGINX_MODULE", "")

_running = []


@atexit.register
def _stop_all():
    for n in list(_running):
        n.stop()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _children(pid):
    """Pids whose parent is pid (the workers of a master), but for one that
    has died and is not reaped yet (a zombie is no worker)."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            kids.append(int(d))
    return kids


class Nginx:
    def __init__(self, http, workers=2, main="", start=True):
        self.prefix = tempfile.mkdtemp(prefix="tg-nginx-")
        os.chmod(self.prefix, 0o755)  # workers may run as nobody
        for d in ("logs", "tmp", "html"):
            os.mkdir(os.path.join(self.prefix, d))
            os.chmod(os.path.join(self.prefix, d), 0o755)
        with open(os.path.join(self.prefix, "html", "index.html"), "w") as f:
            f.write("ok\n")
        os.chmod(os.path.join(self.prefix, "html", "index.html"), 0o644)
        self.port = free_port()
        self.workers = workers
        self.main = main
        self.proc = None
        self.write_conf(http)
        if start:
            self.start()

    def conf_text(self, http):
        p = self.prefix
        return """
load_module %(module)s;
daemon off;
master_process on;
worker_processes %(workers)d;
pid %(p)s/nginx.pid;
error_log %(p)s/logs/error.log info;
%(main)s
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %(p)s/tmp/body;
  proxy_temp_path %(p)s/tmp/proxy;
  fastcgi_temp_path %(p)s/tmp/fastcgi;
  uwsgi_temp_path %(p)s/tmp/uwsgi;
  scgi_temp_path %(p)s/tmp/scgi;
  root %(p)s/html;
  %(http)s
}
""" % {"module": MODULE, "workers": self.workers, "p": p, "main": self.main,
       "http": http.replace("PORT", str(self.port))}

    def write_conf(self, http):
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(self.conf_text(http))

    def start(self):
        self.proc = subprocess.Popen(
            [NGINX, "-p", self.prefix, "-c", self.conf],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _running.append(self)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")
                raise RuntimeError("nginx did not start: %s\n%s"
                                   % (err, self.error_log()))
            if len(self.worker_pids()) == self.workers:
                try:
                    socket.create_connection(("127.0.0.1", self.port),
                                             timeout=1).close()
                    return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not answer: " + self.error_log())
            time.sleep(0.05)

    def worker_pids(self):
        return sorted(_children(self.proc.pid)) if self.proc else []

    def error_log(self):
        try:
            with open(os.path.join(self.prefix, "logs", "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def reload(self, http):
        """Rewrites the configuration and sends SIGHUP. Returns True when
        new workers replaced the old ones, False when the master kept the
        old configuration (its reason is then in the error log)."""
        old = set(self.worker_pids())
        log_len = len(self.error_log())
        self.write_conf(http)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = set(self.worker_pids())
            if not (now & old) and len(now) == self.workers:
                return True
            tail = self.error_log()[log_len:]
            if "[emerg]" in tail or "[alert]" in tail:
                return False
            time.sleep(0.05)
        raise RuntimeError("reload did not finish: " + self.error_log())

    def request(self, path, headers=None, timeout=30):
        """(status, {lowercase name: value}, body)"""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path, headers=headers or {})
            r = c.getresponse()
            body = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, body
        finally:
            c.close()

    def stop(self):
        if self.proc is None:
            return
        pids = self.worker_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in pids:  # workers a killed master would leave behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self in _running:
            _running.remove(self)
        self.proc.stderr.close()
        self.proc = None
        shutil.rmtree(self.prefix, ignore_errors=True)


def check(http, main=""):
    """`nginx -t` on a configuration: (exit status, its output)."""
    n = Nginx(http, main=main, start=False)
    try:
        r = subprocess.run([NGINX, "-t", "-p", n.prefix, "-c", n.conf],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return r.returncode, r.stdout.decode(errors="replace")
    finally:
        shutil.rmtree(n.prefix, ignore_errors=True)


def check_line(http, marker, main=""):
    """`nginx -t` on a configuration: (exit status, its output, "FILE:LINE"
    of the first configuration line that contains marker), for the
    messages that must name the line they are about."""
    n = Nginx(http, main=main, start=False)
    try:
        with open(n.conf) as f:
            lineno = next(i + 1 for i, line in enumerate(f.read().split("\n"))
                          if marker in line)
        r = subprocess.run([NGINX, "-t", "-p", n.prefix, "-c", n.conf],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return (r.returncode, r.stdout.decode(errors="replace"),
                "%s:%d" % (n.conf, lineno))
    finally:
        shutil.rmtree(n.prefix, ignore_errors=True)


def staggered(hosts, paths, gap=0.05):
    """Requests paths[i] at i * gap seconds, to hosts[i % len(hosts)] (or
    the one Nginx given), each on its own connection, waiting for none:
    [(status, seconds it took, X-Status)]."""
    if isinstance(hosts, Nginx):
        hosts = [hosts]
    out = [None] * len(paths)
    t0 = time.monotonic()

    def one(i):
        pause = t0 + i * gap - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        t = time.monotonic()
        st, h, _ = hosts[i % len(hosts)].request(paths[i])
        out[i] = (st, time.monotonic() - t, h.get("x-status"))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(paths))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out
