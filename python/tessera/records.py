"""What a record is to a reader (docs/client.md "What a record is"): its framed bytes as stored,
or its payload. `record=` of Reader and every adapter takes "auto" (the default: the payload
when the dataset says its record format, as `tessera ingest` datasets do), "framed" or
"payload". Payloads per format: a TFRecord's data (a serialized tf.train.Example, as
tf.data.TFRecordDataset gives), a tar sample's members without the archive's end blocks
(tar_sample() turns them into WebDataset's dict), a JSON line's text without its newline, a
LEN32/LEN64 record's bytes."""

import ctypes
import io
import tarfile

from ._lib import c_size, check, lib

RECORD = {"auto": 0, "framed": 1, "payload": 2}
FORMATS = ("none", "tfrecord", "tar", "jsonl", "len32", "len64")


def record_form(record):
    if record not in RECORD:
        raise ValueError(f"record must be one of {', '.join(RECORD)} (got {record!r})")
    return RECORD[record]


def format_code(fmt):
    """A record format's number from its name (None or "none": 0)."""
    fmt = "none" if fmt is None else ("tar" if fmt == "webdataset" else fmt)
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    return FORMATS.index(fmt)


def payload(fmt, data):
    """The payload of one framed record of format fmt (a name or number), a zero-copy view
    of data when data is a memoryview (else the same type sliced). Raises TesseraError
    (TS_EPROTO) for bytes that are not one record of that format."""
    code = fmt if isinstance(fmt, int) else format_code(fmt)
    if not code:
        return data
    view = memoryview(data)
    buf = (ctypes.c_char * len(view)).from_buffer_copy(view) if view.readonly else \
        (ctypes.c_char * len(view)).from_buffer(view)
    off, n = c_size(), c_size()
    check(lib().tessera_record_payload(code, buf, len(view), ctypes.byref(off), ctypes.byref(n)),
          f"a {len(view)}-byte record is not one {FORMATS[code]} record")
    return data[off.value:off.value + n.value]


def tar_sample(data):
    """A tar sample's members as WebDataset gives them: {"__key__": key, ext: bytes, ...}, ext
    being the member name after the key (the name up to the first '.' of its last part)."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as t:
        for m in t.getmembers():
            if not m.isfile():
                continue
            base = m.name.rsplit("/", 1)[-1]
            key, _, ext = base.partition(".")
            prefix = m.name[:len(m.name) - len(base)]
            out.setdefault("__key__", prefix + key)
            out[ext] = t.extractfile(m).read()
    return out


__all__ = ["FORMATS", "RECORD", "payload", "tar_sample"]
