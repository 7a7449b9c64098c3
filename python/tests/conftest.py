"""pytest fixtures: real tesserad processes on loopback (one node, or a cluster with node
certificates made at test time), and datasets of known records.

The build is found at $TESSERA_BUILD_DIR (default: <repo>/build): bin/tesserad, bin/tessera,
lib/libtessera.so (which the tessera package loads through $TESSERA_LIBRARY).
"""

import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("TESSERA_BUILD_DIR", os.path.join(REPO, "build")))
TESSERAD = os.path.join(BUILD, "bin", "tesserad")
CLI = os.path.join(BUILD, "bin", "tessera")
os.environ.setdefault("TESSERA_LIBRARY", os.path.join(BUILD, "lib", "libtessera.so"))
sys.path.insert(0, os.path.join(REPO, "python"))

if not os.path.exists(TESSERAD) or not os.path.exists(os.environ["TESSERA_LIBRARY"]):
    raise RuntimeError(f"no tessera build at {BUILD}: run scripts/build (or set "
                       "TESSERA_BUILD_DIR)")


class Daemon:
    """One tesserad; start() waits for its ready line (never a fixed sleep) and reads the
    addresses it listens on from it: give it port 0 and it picks free ones itself (a port
    bound and released by the test could be taken before the daemon binds it). A restart
    listens on the same addresses."""

    def __init__(self, workdir, name, args):
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(self.dir, "tesserad.log")
        self.args = [TESSERAD, "--data", os.path.join(self.dir, "data"), "--sync", "none"] + args
        self.proc = None
        self.addr = self.tls_addr = None

    def start(self):
        start_at = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            with open(self.log, "rb") as f:
                f.seek(start_at)
                m = re.search(rb"tesserad ready .* listen=(\S+) tls_listen=(\S+)", f.read())
            if m:
                self.addr = m.group(1).decode()
                self.tls_addr = None if m.group(2) == b"-" else m.group(2).decode()
                self._keep_addresses()
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"tesserad did not start: {open(self.log).read()[-2000:]}")

    def _keep_addresses(self):
        for flag, addr in (("--listen", self.addr), ("--tls-listen", self.tls_addr)):
            if addr and flag in self.args:
                self.args[self.args.index(flag) + 1] = addr

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def workdir():
    with tempfile.TemporaryDirectory(prefix="tessera-py-") as d:
        yield d


@pytest.fixture(scope="session")
def node(workdir):
    """A single node (anonymous clients on loopback are admin there)."""
    d = Daemon(workdir, "single", ["--listen", "127.0.0.1:0"]).start()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def cluster(workdir):
    """Three nodes n1..n3 with node certificates; yields (daemons, writer options). Each node
    picks its own ports (port 0); the map naming the addresses they took is then pushed to
    them as admin (tessera map push)."""
    certs = os.path.join(workdir, "certs")
    subprocess.run([os.path.join(REPO, "conf", "mkcerts"), certs, "n1", "n2", "n3"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ca = os.path.join(certs, "ca.pem")
    nodes = []
    for i in range(3):
        nid = f"n{i + 1}"
        nodes.append(Daemon(workdir, nid, [
            "--node-id", nid, "--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0",
            "--tls-cert", os.path.join(certs, f"node-{nid}.pem"),
            "--tls-key", os.path.join(certs, f"node-{nid}.key"), "--tls-ca", ca,
            "--anonymous-role", "reader"]).start())
    mp = os.path.join(workdir, "cluster.map")
    with open(mp, "w") as f:
        f.write("epoch = 1;\npg_count = 16;\nnodes = (\n")
        f.write(",\n".join(
            f'  {{ id = "n{i + 1}"; addr = "{d.addr}"; tls_addr = "{d.tls_addr}"; '
            f'weight = 100; domain = "d{i + 1}"; state = "up"; }}'
            for i, d in enumerate(nodes)))
        f.write("\n);\n")
    subprocess.run([CLI, "-s", nodes[0].tls_addr, "--tls-ca", ca,
                    "--tls-cert", os.path.join(certs, "admin.pem"),
                    "--tls-key", os.path.join(certs, "admin.key"), "map", "push", mp],
                   check=True, stdout=subprocess.DEVNULL)
    from tessera import ConnectOptions
    writer = ConnectOptions(nodes[0].tls_addr, tls_ca=ca,
                            tls_cert=os.path.join(certs, "writer.pem"),
                            tls_key=os.path.join(certs, "writer.key"))
    yield nodes, writer
    for d in nodes:
        d.stop()


def record(i):
    """Record i of the test datasets: its number, then bytes that depend on it."""
    n = 8 + (i * 37) % 300
    return struct.pack("<Q", i) + bytes((i * 7 + j) & 0xFF for j in range(n - 8))


def record_id(data):
    return struct.unpack_from("<Q", bytes(data[:8]))[0]


def load(client, name, n, shards, **policy):
    """A dataset of records 0..n-1, split into `shards` shards of contiguous records."""
    client.create_dataset(name, **policy)
    per, extra, at = n // shards, n % shards, 0
    for s in range(shards):
        k = per + (s < extra)
        client.put_records(name, s, [record(i) for i in range(at, at + k)])
        at += k
    return n
