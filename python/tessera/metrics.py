"""The job's side of tessera's metrics (docs/client.md "Metrics from the job"): the readers'
stats in Prometheus form, through prometheus_client (an optional dependency: pip install
'tessera[metrics]'; Debian: python3-prometheus-client).

    import tessera.metrics
    tessera.metrics.export(loader, rank=rank)   # a Reader, TesseraIterable or DataLoader
    tessera.metrics.serve(9465)                 # http://<host>:9465/metrics

export() adds a source to one collector per registry that reads the sources' stats() when
scraped, so reading costs nothing per record. Series (names from the metrics spec, each with
the rank as a label): tessera_job_data_stall_seconds_total, tessera_job_stalls_total,
tessera_job_retries_total, tessera_job_read_bytes_total{node}, tessera_job_units_total{node}
(counters: they only grow), tessera_job_bytes_ahead (a gauge), and, from the per-step hook
(tessera.torch.StepMonitor), tessera_job_steps_total and the histograms
tessera_job_step_seconds and tessera_job_step_stall_seconds.
"""

import threading

try:
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:  # optional: export() and serve() say what to install
    prometheus_client = None

MISSING = ("tessera.metrics needs prometheus_client, an optional dependency: pip install "
           "'tessera[metrics]' (or prometheus-client; Debian: apt install "
           "python3-prometheus-client)")

# The data stall inside one step: from prefetched (well under a millisecond) to a stuck read.
STALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0, 30.0)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def available():
    """Whether prometheus_client can be imported."""
    return prometheus_client is not None


def _need():
    if prometheus_client is None:
        raise ImportError(MISSING)


def _registry(registry):
    _need()
    return prometheus_client.REGISTRY if registry is None else registry


def add_stats(a, b):
    """Two stats dicts (Reader.stats()) summed: counters and per-node counts added,
    ahead_bytes added (bytes held at once by both), ahead_bytes_max the larger."""
    out = {k: a.get(k, 0) + b.get(k, 0)
           for k in ("units", "bytes", "stall_s", "stalls", "retries", "reconnects",
                     "index_loads", "ahead_bytes")}
    out["ahead_bytes_max"] = max(a.get("ahead_bytes_max", 0), b.get("ahead_bytes_max", 0))
    served = {n: dict(v) for n, v in a.get("served", {}).items()}
    for n, v in b.get("served", {}).items():
        s = served.setdefault(n, {"units": 0, "bytes": 0})
        s["units"] += v["units"]
        s["bytes"] += v["bytes"]
    out["served"] = served
    return out


def source_of(obj):
    """What stats are read from: a tessera.torch.DataLoader's dataset, else obj (a Reader, a
    TesseraIterable, or anything with reader_stats() or stats() giving Reader.stats()'s dict)."""
    ds = getattr(obj, "dataset", None)
    if ds is not None and hasattr(ds, "reader_stats"):
        return ds
    if hasattr(obj, "reader_stats") or hasattr(obj, "stats"):
        return obj
    raise TypeError(f"no reader stats in {type(obj).__name__}: pass a tessera Reader, a "
                    "tessera.torch.TesseraIterable or a tessera.torch.DataLoader")


def stats_of(obj):
    """The stats of obj (see source_of), a Reader.stats() dict."""
    src = source_of(obj)
    f = getattr(src, "reader_stats", None)
    return f() if f is not None else src.stats()


def rank_of(obj, rank=None):
    if rank is not None:
        return int(rank)
    return int(getattr(source_of(obj), "rank", 0) or 0)


class JobCollector:
    """The readers' series of one registry: the sources export() added, read when scraped
    (sources of the same rank summed)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sources = []  # [(rank, source)]

    def add(self, obj, rank=None):
        src, r = source_of(obj), rank_of(obj, rank)
        with self._lock:
            if not any(s is src for _, s in self._sources):
                self._sources.append((r, src))
        return self

    def remove(self, obj):
        """Stops reading obj (its counts leave the series: a reset, as a restart is)."""
        src = source_of(obj)
        with self._lock:
            self._sources = [(r, s) for r, s in self._sources if s is not src]

    def _families(self):
        lab, lab_node = ["rank"], ["rank", "node"]
        return {
            "stall": CounterMetricFamily(
                "tessera_job_data_stall_seconds", "Time the job waited in the tessera reader "
                "for data (seconds)", labels=lab),
            "stalls": CounterMetricFamily(
                "tessera_job_stalls_total", "Reads of the next unit that had to wait for it",
                labels=lab),
            "retries": CounterMetricFamily(
                "tessera_job_retries_total", "Reads tried again (another replica, or once more)",
                labels=lab),
            "bytes": CounterMetricFamily(
                "tessera_job_read_bytes_total", "Bytes the reader returned, by the node that "
                "served them", labels=lab_node),
            "units": CounterMetricFamily(
                "tessera_job_units_total", "Units (records or shards) the reader returned, by "
                "the node that served them", labels=lab_node),
            "ahead": GaugeMetricFamily(
                "tessera_job_bytes_ahead", "Bytes the reader holds or is reading ahead of the "
                "job", labels=lab),
        }

    def describe(self):
        return list(self._families().values())

    def collect(self):
        with self._lock:
            sources = list(self._sources)
        by_rank = {}
        for r, src in sources:
            f = getattr(src, "reader_stats", None)
            st = f() if f is not None else src.stats()
            by_rank[r] = add_stats(by_rank[r], st) if r in by_rank else st
        fam = self._families()
        for r in sorted(by_rank):
            st, rank = by_rank[r], str(r)
            fam["stall"].add_metric([rank], st["stall_s"])
            fam["stalls"].add_metric([rank], st["stalls"])
            fam["retries"].add_metric([rank], st["retries"])
            fam["ahead"].add_metric([rank], st["ahead_bytes"])
            for node in sorted(st["served"]):
                v = st["served"][node]
                fam["bytes"].add_metric([rank, node], v["bytes"])
                fam["units"].add_metric([rank, node], v["units"])
        return list(fam.values())


_collectors = {}  # id(registry) -> (registry, JobCollector, step metrics or None)
_collectors_lock = threading.Lock()


def _entry(registry):
    registry = _registry(registry)
    with _collectors_lock:
        e = _collectors.get(id(registry))
        if e is None or e[0] is not registry:
            c = JobCollector()
            registry.register(c)
            e = _collectors[id(registry)] = [registry, c, None]
        return e


def export(source, rank=None, registry=None):
    """Exports the reader stats of source (a Reader, a tessera.torch.TesseraIterable or
    DataLoader) on registry (default prometheus_client.REGISTRY) with rank as a label
    (default: the source's rank). Read when scraped; the same collector per registry, so
    exporting several sources, or one again, is fine. Returns the collector (its remove(source)
    stops exporting one). ImportError without prometheus_client."""
    return _entry(registry)[1].add(source, rank)


def step_metrics(registry=None):
    """(steps counter, step-time histogram, step-stall histogram), each labelled by rank, on
    registry (default prometheus_client.REGISTRY): made once per registry."""
    e = _entry(registry)
    with _collectors_lock:
        if e[2] is None:
            reg = e[0]
            e[2] = (
                prometheus_client.Counter("tessera_job_steps", "Training steps seen by the "
                                          "per-step hook", ["rank"], registry=reg),
                prometheus_client.Histogram("tessera_job_step_seconds", "Time of each training "
                                            "step (seconds)", ["rank"], registry=reg,
                                            buckets=STEP_BUCKETS),
                prometheus_client.Histogram("tessera_job_step_stall_seconds", "Data stall "
                                            "inside each training step (seconds)", ["rank"],
                                            registry=reg, buckets=STALL_BUCKETS),
            )
        return e[2]


def serve(port, addr="0.0.0.0", registry=None):
    """Serves registry (default prometheus_client.REGISTRY) at http://addr:port/metrics from a
    daemon thread, as prometheus_client.start_http_server does, and returns the server:
    port=0 picks a free port (server.server_port), server.shutdown() stops it."""
    registry = _registry(registry)
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):  # no line per scrape on stderr
            pass

    httpd = make_server(addr, port, prometheus_client.make_wsgi_app(registry),
                        ThreadingWSGIServer, handler_class=Quiet)
    t = threading.Thread(target=httpd.serve_forever, name="tessera-metrics", daemon=True)
    t.start()
    return httpd


__all__ = ["JobCollector", "add_stats", "available", "export", "serve", "stats_of",
           "step_metrics"]
