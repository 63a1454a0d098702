#!/usr/bin/env python3
"""Hot-loop micro-benchmark: CPU microseconds per message of each per-message stage of the store.

A script, not a test: it prints figures. One process, no gRPC, no disk waits: each stage is the
storage code a service runs per message, fed batches of 100 messages of 1 KiB with TAGS, KEYS and a
UNIQ_KEY (what the gateway sends the CommitLog: properties in their stored form, 1,197-byte records).

  encode      CommitLog.encode: validate and pack each record outside the put lock (codec.encode_unplaced)
  place       CommitLog.append: copy each record into the mapped file and place its queue offset,
              physical offset and store time (the put lock's work)
  walk        DispatchDecoder.feed: the dispatcher's walk over the records (fields, TAGS hash, KEYS, UNIQ_KEY)
  read-check  the CommitLog's check of every record it serves (read_checks.find_corrupt: sizes, own offset,
              the body CRC, or the whole-record CRC of a record that carries one)
  cq-write    ConsumeQueue unit writes of the index (ConsumeQueueStore.put per message, or the batch call)
  key-hash    IndexFile key hashing alone (index_key_hash of "topic#UNIQ_KEY" and "topic#KEY")
  index-put   IndexFile insertion of both keys (IndexService.build_index, or the batch call)
  apply       IndexStore.apply of a whole DispatchBatch: the index service's work per batch, all of the
              above on its side (checks, ConsumeQueue and IndexFile writes), without gRPC

Figures are µs per message of thread CPU time, the best of ``--repeat`` rounds (the machine is shared: the
best is the one least disturbed by other processes); each round is a process that makes two passes over
``--count`` messages, the first creating the files (ConsumeQueue, IndexFile) the second then writes into.

    python bench/hot_loops_bench.py                           # this install, both implementations
    python bench/hot_loops_bench.py --compare /path/to/other/.venv/bin/python
                                                              # A/B: another install in the same run
    python bench/hot_loops_bench.py --append-prop-crc         # each also with enabledAppendPropCRC=true

``--compare`` runs this script under each interpreter in turn (passes interleaved) and prints the
figures side by side. ``--append-prop-crc`` adds a column for each with the whole-record CRC (the
``__CRC32#`` property: 20 more bytes a record, a CRC at place, the read check verifying it).
ROCKETSTORE_NO_EXTENSIONS=1 measures the pure-Python code of an install that has
the compiled one; without ``--compare`` the script measures both when the extension is built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

STAGES = ("encode", "place", "walk", "read-check", "cq-write", "key-hash", "index-put", "apply")
BATCH = 100
BODY_SIZE = 1024
TOPIC = "BenchTopic"
QUEUES = 8


def _cpu() -> float:
    return time.thread_time()


def measure(count: int, repeat: int, prop_crc: bool = False) -> dict[str, float]:
    """µs per message of each stage, in this interpreter with its current implementation; ``prop_crc``:
    with enabledAppendPropCRC (and the read check forcing it)."""
    from rocketstore.services.commitlog.commitlog import CommitLog
    from rocketstore.services.dispatcher.decode import DispatchDecoder
    from rocketstore.services.index.consume_queue import ConsumeQueueStore
    from rocketstore.services.index.index_file import IndexService, index_key_hash
    from rocketstore.services.index.store import IndexStore

    from rocketstore.config.settings import load_settings
    from rocketstore.storage.message_id import UniqKeyGenerator
    from rocketstore.v1 import commitlog_pb2 as cl_pb
    from rocketstore.v1 import index_pb2 as ix_pb

    work = tempfile.mkdtemp(prefix="rs-hot-loops-")
    try:
        rnd_body = os.urandom(BODY_SIZE * 16)
        ids = UniqKeyGenerator("10.0.0.7")
        now = int(time.time() * 1000)
        batches = []
        n_batches = max(1, count // BATCH)
        for b in range(n_batches):
            req = cl_pb.AppendBatchRequest()
            for i in range(BATCH):
                k = b * BATCH + i
                m = req.messages.add()
                # A send's messages go to one queue, as the gateway appends them.
                m.topic, m.queue_id, m.born_host, m.born_timestamp = TOPIC, b % QUEUES, "10.0.0.7:53211", now + k
                off = (k % 16) * 64
                m.body = rnd_body[off:off + BODY_SIZE]
                m.properties_text = f"TAGS\x01Tag{k % 4}\x02KEYS\x01order-{k}\x02UNIQ_KEY\x01{ids.next()}\x02"
            batches.append(req.messages)
        settings = load_settings(None, {"storePathRootDir": work, "mapedFileSizeCommitLog": str(1 << 30),
                                        "enabledAppendPropCRC": str(prop_crc).lower()}, {})
        cl = CommitLog(settings, "10.0.0.9:10911")
        cl.mapped_file_queue.load()  # creates the directory
        cl.allocator.start()
        results: dict[str, list[float]] = {s: [] for s in STAGES}
        state: dict = {}
        try:
            for _ in range(repeat):
                _one_pass(cl, batches, results, state, work, DispatchDecoder, ConsumeQueueStore, IndexService,
                          index_key_hash, IndexStore, ix_pb)
        finally:
            if "store" in state:
                state["store"].shutdown()
            if "cqs" in state:
                state["cqs"].shutdown()
            if "index" in state:
                state["index"].shutdown()
            cl.allocator.shutdown()
            cl.mapped_file_queue.shutdown()
        total = n_batches * BATCH
        return {s: min(v) * 1e6 / total for s, v in results.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _one_pass(cl, batches, results, state, work, DispatchDecoder, ConsumeQueueStore,  # noqa: ANN001, N803
              IndexService, index_key_hash, IndexStore, ix_pb) -> None:  # noqa: ANN001, N803
    from rocketstore.config.settings import load_settings

    # encode + place: into the CommitLog, as a put does
    # One batch after the other, as a put does (the records of a batch are freed before the next one).
    start = cl.max_offset
    encode_s = place_s = 0.0
    for msgs in batches:
        t0 = _cpu()
        records, res = cl.encode(msgs)
        t1 = _cpu()
        cl.append(records, res)
        t2 = _cpu()
        encode_s += t1 - t0
        place_s += t2 - t1
    results["encode"].append(encode_s)
    results["place"].append(place_s)
    end = cl.max_offset
    data = cl.read_raw(start, end - start)
    assert len(data) == end - start, "the pass fits in one CommitLog file"
    # walk: the dispatcher's decode of the same bytes, in chunks of one batch
    step = len(data) // len(batches)
    chunks = [(start + i * step, data[i * step:(i + 1) * step] if i < len(batches) - 1 else data[i * step:])
              for i in range(len(batches))]
    decoder = DispatchDecoder(start, (1000,))
    cols = []
    t = _cpu()
    for offset, chunk in chunks:
        cols.append(decoder.feed(offset, chunk))
    results["walk"].append(_cpu() - t)
    assert sum(len(c) for c in cols) == len(batches) * BATCH
    # read-check: what ReadRecords checks of every record it serves, over the same bytes
    from rocketstore.services.commitlog.read_checks import find_corrupt

    force = cl.append_prop_crc
    t = _cpu()
    for offset, chunk in _record_chunks(data, start, len(batches)):
        bad = find_corrupt(chunk, offset, force)
    results["read-check"].append(_cpu() - t)
    assert not bad
    # ConsumeQueue unit writes
    cqs = state.get("cqs")
    if cqs is None:  # kept across passes: the first one creates the files, the best one is the steady state
        cqs = state["cqs"] = ConsumeQueueStore(os.path.join(work, "cq-stage"))
    put_batch = getattr(cqs, "put_batch", None)
    t = _cpu()
    for c in cols:
        if put_batch is not None:
            put_batch(c.topic, c.queue_id, c.queue_offset, c.physical_offset, c.size, c.tags_code)
        else:
            put = cqs.put
            for topic, qid, qoff, phy, size, code in zip(c.topic, c.queue_id, c.queue_offset, c.physical_offset,
                                                         c.size, c.tags_code, strict=True):
                put(topic, qid, qoff, phy, size, code)
    results["cq-write"].append(_cpu() - t)
    # IndexFile: hashing alone, then insertion
    keys = [f"{topic}#{k}" for c in cols for topic, k in zip(c.topic, c.uniq_key, strict=True)]
    keys += [f"{topic}#{k}" for c in cols for topic, k in zip(c.topic, c.keys, strict=True)]
    t = _cpu()
    for k in keys:
        index_key_hash(k)
    results["key-hash"].append((_cpu() - t) * len(cols) * BATCH / (len(keys) / 2))  # two keys a message
    index = state.get("index")
    if index is None:
        index = state["index"] = IndexService(os.path.join(work, "index-stage"), 5_000_000, 20_000_000, None)
    build_batch = getattr(index, "build_index_batch", None)
    t = _cpu()
    for c in cols:
        if build_batch is not None:
            build_batch(c.topic, c.keys, c.uniq_key, c.physical_offset, c.size, c.store_timestamp, c.sys_flag, 0,
                        len(c))
        else:
            build = index.build_index
            for topic, keys_, uniq, phy, size, ts, flag in zip(c.topic, c.keys, c.uniq_key, c.physical_offset,
                                                               c.size, c.store_timestamp, c.sys_flag, strict=True):
                build(topic, keys_, uniq or None, phy, size, ts, flag)
        index.publish()
    results["index-put"].append(_cpu() - t)
    # the index store's apply of whole batches

    class Reader:
        def read_records(self, ranges):  # noqa: ANN001, ANN202
            return [cl.get_data(o, z) for o, z in ranges]

        def min_offset(self) -> int:
            return cl.min_offset

    store = state.get("store")
    if store is None:
        store = state["store"] = IndexStore(load_settings(None, {"storePathRootDir": os.path.join(work, "apply-stage"),
                                                                 "flushIntervalConsumeQueue": "60000"}, {}), Reader())
        store.start()
        store.position = start
    pbs = [ix_pb.DispatchBatch(topic=c.topic, queue_id=c.queue_id, queue_offset=c.queue_offset,
                               physical_offset=c.physical_offset, size=c.size, tags_code=c.tags_code,
                               store_timestamp=c.store_timestamp, sys_flag=c.sys_flag, keys=c.keys,
                               uniq_key=c.uniq_key, from_offset=c.from_offset, next_offset=c.next_offset,
                               commitlog_max_offset=end, commitlog_instance_id="bench") for c in cols]
    t = _cpu()
    for i, b in enumerate(pbs):
        store.apply(b, verify=i == 0)
    results["apply"].append(_cpu() - t)


def _record_chunks(data: bytes, start: int, n: int) -> list[tuple[int, bytes]]:
    """``data`` (whole records from CommitLog offset ``start``) cut into ``n`` runs of whole records."""
    ends, pos = [], 0
    while pos < len(data):
        pos += int.from_bytes(data[pos:pos + 4], "big")
        ends.append(pos)
    per = max(1, len(ends) // n)
    cuts = [0, *ends[per - 1::per]]
    if cuts[-1] != len(data):
        cuts.append(len(data))
    return [(start + a, data[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]


def implementation() -> str:
    try:
        from rocketstore.storage import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return "python"
    return "compiled" if _speedups.enabled() else "python"


def _child(args: argparse.Namespace) -> None:
    figures = measure(args.count, args.repeat, args.prop_crc)
    print(json.dumps({"implementation": implementation(), "figures": figures}))


def _run_child(python: str, args: argparse.Namespace, env_extra: dict[str, str], prop_crc: bool = False) -> dict:
    env = dict(os.environ, **env_extra)
    # Two passes a process: the first creates the files (ConsumeQueue, IndexFile), the second is the steady state.
    out = subprocess.run([python, os.path.abspath(__file__), "--child", "--count", str(args.count),
                          "--repeat", "2", *(["--prop-crc"] if prop_crc else [])], check=True,
                         capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=20_000, help="messages per pass (default: 20000)")
    p.add_argument("--repeat", type=int, default=5, help="passes; the best is reported (default: 5)")
    p.add_argument("--compare", metavar="PYTHON", action="append", default=[],
                   help="another interpreter (install) to measure in the same run, repeatable")
    p.add_argument("--append-prop-crc", action="store_true",
                   help="measure each variant also with enabledAppendPropCRC=true, interleaved")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prop-crc", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    variants: list[tuple[str, str, dict[str, str], bool]] = []
    for py in args.compare:
        variants.append((f"{py}", py, {}, False))
    variants.append(("this install, pure Python", sys.executable, {"ROCKETSTORE_NO_EXTENSIONS": "1"}, False))
    if _run_child(sys.executable, argparse.Namespace(count=BATCH, repeat=1), {})["implementation"] == "compiled":
        variants.append(("this install, compiled", sys.executable, {}, False))
    if args.append_prop_crc:
        variants += [(f"{label} + CRC", py, env, True) for label, py, env, _ in variants]
    best: dict[str, dict[str, float]] = {label: {} for label, *_ in variants}
    impl: dict[str, str] = {}
    for _ in range(args.repeat):  # interleaved passes: a load change hits every variant alike
        for label, py, env, prop_crc in variants:
            out = _run_child(py, args, env, prop_crc)
            impl[label] = out["implementation"]
            for stage, v in out["figures"].items():
                best[label][stage] = min(v, best[label].get(stage, float("inf")))
    labels = [label for label, *_ in variants]
    width = max(12, *(len(label) for label in labels))
    print(f"µs per message (best of {args.repeat} passes of {args.count} messages, 1 KiB bodies, batches of {BATCH})")
    print(f"{'stage':<10} " + " ".join(f"{label:>{width}}" for label in labels))
    for stage in STAGES:
        cells = [best[label].get(stage) for label in labels]
        print(f"{stage:<10} " + " ".join(f"{c:>{width}.2f}" if c is not None else f"{'-':>{width}}" for c in cells))
    print(f"{'(impl)':<10} " + " ".join(f"{impl[label]:>{width}}" for label in labels))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
