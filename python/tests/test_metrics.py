"""tessera.metrics and tessera.torch.StepMonitor against a real daemon: the exported series
equal what the readers report and what was read (a Reader, a DataLoader with and without
workers, over two epochs), carry the rank, scrape over HTTP as text promtool accepts, and the
per-step hook sees the stall of a step whose data was slow (the daemon stopped) and none in a
step whose data was read ahead. prometheus_client is a test dependency (scripts/deps): a
missing one fails here, it does not skip."""

import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

import tessera.metrics
from conftest import load, record
from tessera import Client, Reader
from tessera.torch import DataLoader, StepMonitor, TesseraIterable

N = 400
TOTAL = sum(len(record(i)) for i in range(N))


@pytest.fixture(scope="module")
def ds(node):
    with Client(node.addr) as c:
        load(c, "metrics", N, 4)
    return node.addr


def sample(reg, name, **labels):
    return reg.get_sample_value(name, {k: str(v) for k, v in labels.items()})


def by_node(reg, name, rank):
    out = {}
    for fam in reg.collect():
        for s in fam.samples:
            if s.name == name and s.labels.get("rank") == str(rank):
                out[s.labels["node"]] = s.value
    return out


def test_reader_series_equal_its_stats_and_the_bytes_read(ds):
    reg = CollectorRegistry()
    r = Reader(ds, "metrics", rank=1, world=2)
    tessera.metrics.export(r, registry=reg)  # the rank from the reader
    got = 0
    for i, data in enumerate(r):
        got += len(data)
        if i + 1 == 50:
            break
    st = r.stats()
    assert st["units"] == 50 and st["bytes"] == got > 0
    served = by_node(reg, "tessera_job_read_bytes_total", 1)
    assert sum(served.values()) == got == st["bytes"]
    assert served == {n: v["bytes"] for n, v in st["served"].items()}
    assert sum(by_node(reg, "tessera_job_units_total", 1).values()) == 50
    assert sample(reg, "tessera_job_read_bytes_total", rank=0, node=next(iter(served))) is None
    assert sample(reg, "tessera_job_data_stall_seconds_total", rank=1) == st["stall_s"]
    assert sample(reg, "tessera_job_stalls_total", rank=1) == st["stalls"]
    assert sample(reg, "tessera_job_retries_total", rank=1) == st["retries"] == 0
    ahead = sample(reg, "tessera_job_bytes_ahead", rank=1)
    assert ahead is not None and ahead >= 0
    rest = sum(len(d) for d in r)
    r.close()  # a closed reader's counters stay (counters never go back)
    assert sum(by_node(reg, "tessera_job_read_bytes_total", 1).values()) == got + rest
    assert got + rest == sum(len(record(i)) for i in range(N // 2, N))  # rank 1 of 2
    assert sample(reg, "tessera_job_bytes_ahead", rank=1) == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_series_count_every_epoch(ds, workers):
    reg = CollectorRegistry()
    d = TesseraIterable(ds, "metrics", batch_size=10, rank=2, world=4, shuffle=True, seed=1)
    loader = DataLoader(d, num_workers=workers)
    tessera.metrics.export(loader, registry=reg)
    want = 0
    for epoch in range(2):
        d.set_epoch(epoch)
        for batch in loader:
            want += sum(len(x) for x in batch)
        st = loader.reader_stats()
        assert st["bytes"] == want and st["units"] == N // 4 * (epoch + 1)
        assert sum(by_node(reg, "tessera_job_read_bytes_total", 2).values()) == want
        assert sum(by_node(reg, "tessera_job_units_total", 2).values()) == N // 4 * (epoch + 1)
        assert sample(reg, "tessera_job_stalls_total", rank=2) == st["stalls"] > 0


def test_scrape_over_http_passes_promtool(ds):
    reg = CollectorRegistry()
    r = Reader(ds, "metrics", rank=3, world=4)
    tessera.metrics.export(r, registry=reg)
    n = sum(len(x) for x in r)
    mon = StepMonitor(r, registry=reg)
    with mon.step():
        time.sleep(0.001)
    httpd = tessera.metrics.serve(0, addr="127.0.0.1", registry=reg)
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        httpd.shutdown()
        r.close()
    for name in ("tessera_job_data_stall_seconds_total", "tessera_job_stalls_total",
                 "tessera_job_retries_total", "tessera_job_bytes_ahead",
                 "tessera_job_steps_total", "tessera_job_step_seconds_bucket",
                 "tessera_job_step_stall_seconds_count"):
        assert f'{name}{{' in text and 'rank="3"' in text, name
    lines = [ln for ln in text.splitlines() if ln.startswith("tessera_job_read_bytes_total{")]
    assert lines and sum(float(ln.rsplit(" ", 1)[1]) for ln in lines) == n
    assert "# TYPE tessera_job_read_bytes_total counter" in text
    assert "# TYPE tessera_job_bytes_ahead gauge" in text
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                       capture_output=True)
    assert p.returncode == 0, (p.stdout + p.stderr).decode() + text


def _batches(reader, size):
    it = iter(reader)
    while True:
        b = [x for _, x in zip(range(size), it)]
        if not b:
            return
        yield b


def test_step_hook_sees_a_slow_step_and_a_prefetched_one(ds, node):
    reg = CollectorRegistry()
    seen = []
    # Slow: a window of 8 records, steps of 32; the daemon stopped for 0.3 s before step 2.
    r = Reader(ds, "metrics", rank=0, world=1, window_units=8, depth=8, connections=1)
    mon = StepMonitor(r, rank=5, registry=reg, on_step=seen.append)
    for i, batch in enumerate(mon.wrap(_batches(r, 32))):
        assert len(batch) == 32
        if i == 0:
            time.sleep(0.1)  # the window is full
            node.proc.send_signal(signal.SIGSTOP)
            t = threading.Timer(0.3, node.proc.send_signal, (signal.SIGCONT,))
            t.start()
        if i == 2:
            break
    t.join()
    node.proc.send_signal(signal.SIGCONT)
    r.close()
    assert [s.step for s in seen] == [1, 2] and mon.last is seen[-1]
    slow = seen[1]
    assert slow.stall_s >= 0.15, seen
    assert slow.wait_s >= slow.stall_s - 0.01 and slow.seconds >= slow.stall_s

    # Prefetched: a window holding the whole plan, read ahead while the job slept.
    r = Reader(ds, "metrics", rank=0, world=1, window_units=1024)
    mon = StepMonitor(r, rank=5, registry=reg, on_step=seen.append)
    deadline = time.time() + 10
    while r.stats()["ahead_bytes"] < TOTAL and time.time() < deadline:
        time.sleep(0.01)
    assert r.stats()["ahead_bytes"] == TOTAL  # everything read, nothing returned yet
    for batch in mon.wrap(_batches(r, 100)):
        time.sleep(0.01)
    r.close()
    fast = seen[2:]
    assert len(fast) == N // 100  # the end met after the last batch is no step
    assert all(s.stall_s < 0.002 for s in fast), fast
    assert sample(reg, "tessera_job_steps_total", rank=5) == 2 + len(fast)
    assert sample(reg, "tessera_job_step_stall_seconds_count", rank=5) == 2 + len(fast)
    total_stall = sum(s.stall_s for s in seen)
    assert abs(sample(reg, "tessera_job_step_stall_seconds_sum", rank=5) - total_stall) < 1e-6
    assert sample(reg, "tessera_job_step_stall_seconds_bucket", rank=5, le="0.1") == len(fast) + 1
    assert sample(reg, "tessera_job_step_seconds_count", rank=5) == 2 + len(fast)


def test_step_hook_with_dataloader_workers(ds):
    reg = CollectorRegistry()
    d = TesseraIterable(ds, "metrics", batch_size=20, rank=0, world=1, shuffle=False)
    loader = DataLoader(d, num_workers=2)
    mon = StepMonitor(loader, registry=reg)
    n = sum(len(b) for b in mon.wrap(loader))
    assert n == N and mon.steps == N // 20 and mon.last.seconds > 0
    assert sample(reg, "tessera_job_steps_total", rank=0) == mon.steps
    assert loader.reader_stats()["units"] == N


def test_missing_prometheus_client_says_what_to_install(monkeypatch):
    monkeypatch.setattr(tessera.metrics, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"tessera\[metrics\]"):
        tessera.metrics.export(object())
    with pytest.raises(ImportError, match="prometheus_client"):
        tessera.metrics.serve(0)
    assert not tessera.metrics.available()


def test_default_registry_and_one_collector_per_registry(ds):
    r1 = Reader(ds, "metrics", rank=0, world=2)
    r2 = Reader(ds, "metrics", rank=1, world=2)
    c1 = tessera.metrics.export(r1)
    c2 = tessera.metrics.export(r2)
    assert c1 is c2  # both on prometheus_client.REGISTRY, one collector
    a, b = sum(len(x) for x in r1), sum(len(x) for x in r2)
    reg = prometheus_client.REGISTRY
    assert sum(by_node(reg, "tessera_job_read_bytes_total", 0).values()) == a
    assert sum(by_node(reg, "tessera_job_read_bytes_total", 1).values()) == b
    assert a + b == TOTAL
    c1.remove(r1)
    assert by_node(reg, "tessera_job_read_bytes_total", 0) == {}
    c1.remove(r2)
    r1.close()
    r2.close()
    assert os.environ.get("TESSERA_LIBRARY")
