# SPDX-License-Identifier: MIT
"""harness.py - starts `tollgate serve` for the Python tests and always
stops it.

Server(tollgate, *options, env=None, preexec_fn=None) starts `tollgate
serve --port 0 OPTIONS` (with that environment, and preexec_fn run in the
child first) and waits (up to 60 s) for its ready line, from which it reads
the port. stop()
sends SIGTERM and requires exit status 0 within 60 s (under the sanitizers:
no leak, no report). Every server still running at exit is killed, so a
failing test never leaves one behind.
"""
import atexit
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import time

_running = []


@atexit.register
def _kill_all():
    for proc in _running:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Server:
    def __init__(self, tollgate, *options, env=None, preexec_fn=None):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [tollgate, "serve", "--port", "0", *options],
            stdout=subprocess.PIPE, stderr=self.log, env=env,
            preexec_fn=preexec_fn)
        _running.append(self.proc)
        self.port = None
        out = b""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + 60
        while b"tollgate serve: ready\n" not in out:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("server did not start: %s%s"
                                   % (out.decode(errors="replace"),
                                      self.stderr()))
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                out += os.read(fd, 4096)
        out = out.decode()
        self.banner = out  # the lines up to "ready", e.g. the metrics URL
        m = re.search(r"listening on \S+ port (\d+)", out)
        if m:
            self.port = int(m.group(1))

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def connect(self, timeout=30):
        """A raw socket to the server."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.settimeout(timeout)
        return s

    def stop(self):
        """SIGTERM; returns the exit status (0 expected), waiting <= 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("server ignored SIGTERM for 60 s")
        err = self.stderr()
        self.close()
        if rc != 0:
            raise AssertionError("server exited with %d:\n%s" % (rc, err))
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.stop()
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.close()

    def close(self):
        if not self.log.closed:
            self.proc.stdout.close()
            self.log.close()


def recv_until(sock, predicate, limit=1 << 24):
    """Reads until predicate(data) holds or the peer closes; returns data."""
    data = b""
    while not predicate(data) and len(data) < limit:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def read_to_eof(sock):
    """Everything until the server closes; a reset counts as closed."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data


def raise_fd_limit(want):
    """Lets this process open `want` sockets if the hard limit allows."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


TOLLGATE = os.environ.get("TOLLGATE")
