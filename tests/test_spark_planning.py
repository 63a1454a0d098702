"""The Spark data source's option checks and read planning, without Spark: offsets JSON, per-queue ranges,
slices, pushed filters, micro-batch rate limits."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from rocketstore.spark.options import (
    GatewayAccess,
    OptionError,
    parse_read_options,
    parse_timestamp,
    parse_write_options,
)
from rocketstore.spark.planning import (
    PlanError,
    Pushed,
    QueueInfo,
    QueueSlice,
    initial_offsets,
    merge_forward,
    parse_offsets,
    plan_ranges,
    push_filters,
    rate_limit,
    split_ranges,
    stream_ranges,
)

BASE = {"endpoint": "127.0.0.1:8081", "topic": "T"}


def opts(**extra: str):  # type: ignore[no-untyped-def]
    return parse_read_options({**BASE, **extra})


# --- options ---------------------------------------------------------------------------------
def test_defaults_read_everything_from_earliest_to_latest() -> None:
    o = opts()
    assert o.topics == ("T",) and o.topic_pattern is None
    assert o.starting == "earliest" and o.ending == "latest"
    assert o.expression == "*" and o.tag_set is None
    assert parse_read_options(BASE, streaming=True).starting == "latest"  # Kafka's streaming default


def test_options_are_case_insensitive_and_topics_split() -> None:
    o = parse_read_options({"ENDPOINT": "h:1", "Topics": "A, B,A", "startingoffsets": "LATEST",
                            "checkpointLocation": "/tmp/c"})  # Spark's own: passed to sources too
    assert o.topics == ("A", "B") and o.starting == "latest"


@pytest.mark.parametrize(("options", "message"), [
    ({"topic": "T"}, "option 'endpoint' is required"),
    ({**BASE, "endpoint": "localhost"}, "expected HOST:PORT"),
    ({**BASE, "endpoint": "h:99999"}, "expected HOST:PORT"),
    ({"endpoint": "h:1"}, "say what to read"),
    ({**BASE, "topics": "A,B"}, "use exactly one of"),
    ({**BASE, "topic": "bad topic"}, "is not a topic name"),
    ({"endpoint": "h:1", "topicPattern": "("}, "not a regular expression"),
    ({**BASE, "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
    ({**BASE, "startingOffsets": "first"}, "expected 'earliest', 'latest' or JSON"),
    ({**BASE, "startingOffsets": '{"T": {"0": "x"}}'}, "not a whole number"),
    ({**BASE, "startingOffsets": '{"T": {"a": 1}}'}, "queue id 'a'"),
    ({**BASE, "startingOffsets": '{"T": {"0": -3}}'}, "offsets are >= 0"),
    ({**BASE, "startingOffsets": '{"T": 5}'}, "must map to a non-empty object"),
    ({**BASE, "startingOffsets": "[1]"}, "top level must be a non-empty object"),
    ({**BASE, "endingOffsets": "earliest"}, "cannot be 'earliest'"),
    ({**BASE, "endingOffsets": '{"T": {"0": -2}}'}, "offsets are >= 0 (-1 for latest)"),
    ({**BASE, "startingOffsets": '{"U": {"0": 1}}'}, "names topic(s) 'U'"),
    ({**BASE, "startingOffsets": '{"T": {"0": 9}}', "endingOffsets": '{"T": {"0": 3}}'}, "before its startingOffsets"),
    ({**BASE, "startingTimestamp": "yesterday"}, "expected milliseconds since the epoch"),
    ({**BASE, "startingTimestamp": "2000", "endingTimestamp": "1000"}, "before startingTimestamp"),
    ({**BASE, "tags": "A ||"}, "option 'tags'"),
    ({**BASE, "maxMessagesPerPartition": "0"}, "it must be >= 1"),
    ({**BASE, "maxMessagesPerPartition": "lots"}, "expected a whole number"),
    ({**BASE, "batchMessages": "70000"}, "1..65536"),
    ({**BASE, "maxOffsetsPerTrigger": "10"}, "for streaming reads"),
    ({**BASE, "path": "T"}, "takes no path"),
])
def test_bad_read_options_are_refused_with_what_to_change(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as e:
        parse_read_options(options)
    assert message in str(e.value)


def test_stream_refuses_an_end() -> None:
    with pytest.raises(OptionError, match="for batch reads"):
        parse_read_options({**BASE, "endingOffsets": "latest"}, streaming=True)


def test_timestamps_as_millis_or_iso() -> None:
    assert parse_timestamp("1700000000000", "x") == 1700000000000
    assert parse_timestamp("2023-11-14T22:13:20Z", "x") == 1700000000000
    assert parse_timestamp("2023-11-14T22:13:20", "x") == 1700000000000  # no zone: UTC
    assert parse_timestamp("2023-11-14T23:13:20+01:00", "x") == 1700000000000


def test_tags_option_becomes_an_expression_and_an_exact_set() -> None:
    o = opts(tags="B || A")
    assert o.expression == "A || B" and o.tag_set == {"A", "B"}
    assert opts(tags="*").tag_set is None


def test_write_options() -> None:
    w = parse_write_options({"endpoint": "h:1", "topic": "T", "batchSize": "10"})
    assert (w.topic, w.batch_size) == ("T", 10)
    with pytest.raises(OptionError, match="unknown option 'tags'"):
        parse_write_options({"endpoint": "h:1", "tags": "x"})
    with pytest.raises(OptionError, match="1..4096"):
        parse_write_options({"endpoint": "h:1", "batchSize": "5000"})


# --- offsets and ranges ------------------------------------------------------------------------
QUEUES = [QueueInfo("T", 0, 0, 100), QueueInfo("T", 1, 10, 50), QueueInfo("T", 2, 0, 0), QueueInfo("U", 0, 5, 8)]


def test_tls_and_credentials_options(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    access = opts(**{"tls.client.trustCertPath": str(ca), "accessKey": "alice", "secretKey": "s3cret"}).access
    # The CA implies TLS and travels as its PEM; the secret key never shows in a printed plan.
    assert (access.tls, access.ca_pem, access.access_key, access.secret_key) == (True, ca.read_bytes(), "alice",
                                                                                 "s3cret")
    assert "s3cret" not in repr(access) and "BEGIN" not in repr(access)
    assert parse_write_options({"endpoint": "h:1", "TLS.ENABLE": "true"}).access.tls
    assert opts().access == GatewayAccess()  # plaintext, keys from each process's environment
    for options, message in [
        ({"accessKey": "alice"}, "option 'accessKey' is set without 'secretKey'"),
        ({"secretKey": "s3cret"}, "option 'secretKey' is set without 'accessKey'"),
        ({"tls.client.trustCertPath": str(tmp_path / "none.crt")}, "none.crt', which cannot be read"),
        ({"tls.client.trustCertPath": str(tmp_path)}, "which cannot be read"),
        ({"tls.client.trustCertPath": str(ca), "tls.enable": "false"}, "while 'tls.enable' is false"),
        ({"tls.enable": "yes"}, "option 'tls.enable' is 'yes': expected true or false"),
    ]:
        with pytest.raises(OptionError, match=re.escape(message)):
            opts(**options)
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(OptionError, match="holds no PEM certificate"):
        opts(**{"tls.client.trustCertPath": str(tmp_path / "key.pem")})


def test_client_certificate_options(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert = tmp_path / "client.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    key = ec.generate_private_key(ec.SECP256R1())
    plain = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    (tmp_path / "client.key").write_bytes(plain)
    (tmp_path / "locked.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    given = {"tls.client.certPath": str(cert), "tls.client.keyPath": str(tmp_path / "client.key")}
    # RocketMQ's client names; a certificate implies TLS, and both travel as PEM, never printed.
    access = opts(**given).access
    assert (access.tls, access.ca_pem, access.cert_pem, access.key_pem) == (True, None, cert.read_bytes(), plain)
    assert "PRIVATE" not in repr(access) and "BEGIN" not in repr(access)
    # An encrypted key is decrypted on the driver with tls.client.keyPassword (grpc takes no password).
    unlocked = opts(**{**given, "tls.client.keyPath": str(tmp_path / "locked.key"), "tls.client.keyPassword": "pw"})
    assert unlocked.access.key_pem == plain
    for options, message in [
        ({"tls.client.certPath": str(cert)}, "option 'tls.client.certPath' is set without 'tls.client.keyPath'"),
        ({"tls.client.keyPath": str(cert)}, "option 'tls.client.keyPath' is set without 'tls.client.certPath'"),
        ({**given, "tls.enable": "false"}, "option 'tls.client.certPath' is set while 'tls.enable' is false"),
        ({**given, "tls.client.keyPath": str(cert)}, "which holds no PEM private key"),
        ({**given, "tls.client.certPath": str(tmp_path / "client.key")}, "which holds no PEM certificate"),
        ({**given, "tls.client.keyPath": str(tmp_path / "locked.key")}, "cannot be read with option "
                                                                         "'tls.client.keyPassword'"),
        ({**given, "tls.client.keyPath": str(tmp_path / "locked.key"), "tls.client.keyPassword": "guess"},
         "cannot be read with option 'tls.client.keyPassword'"),
    ]:
        with pytest.raises(OptionError, match=re.escape(message)):
            opts(**options)


def test_parse_offsets_markers() -> None:
    assert parse_offsets('{"T": {"0": 5, "1": -2, "2": -1}}', "s", "earliest", True) == {"T": {0: 5, 1: -2, 2: -1}}
    assert parse_offsets(None, "s", "latest", True) == "latest"


def test_plan_ranges_clamps_and_resolves_markers() -> None:
    spec = parse_offsets('{"T": {"0": 5, "1": -2}}', "s", "earliest", True)
    ending = parse_offsets('{"T": {"0": 500, "1": 20}}', "e", "latest", False)
    assert plan_ranges(QUEUES, spec, ending) == [
        QueueSlice("T", 0, 5, 100), QueueSlice("T", 1, 10, 20), QueueSlice("T", 2, 0, 0), QueueSlice("U", 0, 5, 8)]
    # Expired messages are skipped (start below min), a start past the end reads nothing.
    spec = parse_offsets('{"T": {"1": 3, "0": 400}}', "s", "earliest", True)
    assert plan_ranges(QUEUES[:2], spec, "latest") == [QueueSlice("T", 0, 100, 100), QueueSlice("T", 1, 10, 50)]
    assert plan_ranges(QUEUES, "latest", "latest")[0] == QueueSlice("T", 0, 100, 100)


def test_plan_ranges_by_time_wins_over_offsets() -> None:
    queues = [QueueInfo("T", 0, 0, 100, start_offset_by_time=30, end_offset_by_time=60)]
    assert plan_ranges(queues, "earliest", "latest", True, True) == [QueueSlice("T", 0, 30, 60)]
    assert plan_ranges(queues, "earliest", "latest", True, False) == [QueueSlice("T", 0, 30, 100)]


def test_a_time_from_a_filter_only_narrows_the_offsets() -> None:
    queues = [QueueInfo("T", 0, 0, 100, start_offset_by_time=30, end_offset_by_time=60)]
    starting = parse_offsets('{"T": {"0": 40}}', "s", "earliest", True)
    ending = parse_offsets('{"T": {"0": 50}}', "e", "latest", False)
    assert plan_ranges(queues, starting, ending, True, True, start_time_wins=False, end_time_wins=False) == [
        QueueSlice("T", 0, 40, 50)]
    assert plan_ranges(queues, "earliest", "latest", True, True, start_time_wins=False, end_time_wins=False) == [
        QueueSlice("T", 0, 30, 60)]


def test_offsets_for_unknown_queues_are_refused() -> None:
    with pytest.raises(PlanError, match=r"queue\(s\) 7 of topic 'T', which has queues 0..2"):
        plan_ranges(QUEUES, parse_offsets('{"T": {"7": 1}}', "startingOffsets", "earliest", True), "latest")
    with pytest.raises(PlanError, match="names topic 'X'"):
        plan_ranges(QUEUES, "earliest", parse_offsets('{"X": {"0": 1}}', "endingOffsets", "latest", False))


def _check_tiling(ranges: list[QueueSlice], slices: list[QueueSlice], max_per: int) -> None:
    """Slices cover each range exactly: adjacent, no gap, no overlap, none larger than allowed."""
    for r in ranges:
        mine = sorted((s for s in slices if (s.topic, s.queue_id) == (r.topic, r.queue_id)), key=lambda s: s.start)
        if r.size == 0:
            assert mine == []
            continue
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
        assert all(0 < s.size <= max_per for s in mine)


def test_split_ranges_tiles_every_queue() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ranges = [QueueSlice("T", q, s, s + rng.choice([0, 1, 7, 100, 999])) for q, s in
                  enumerate(rng.randrange(0, 50) for _ in range(rng.randrange(1, 6)))]
        max_per = rng.choice([1, 3, 10, 64, 1000])
        slices = split_ranges(ranges, max_per)
        _check_tiling(ranges, slices, max_per)
        total = sum(r.size for r in ranges)
        assert sum(s.size for s in slices) == total


def test_split_ranges_is_even_and_honours_min_partitions() -> None:
    slices = split_ranges([QueueSlice("T", 0, 0, 250)], 100)
    assert [s.size for s in slices] == [83, 83, 84]
    slices = split_ranges([QueueSlice("T", 0, 0, 90), QueueSlice("T", 1, 0, 10)], 1000, min_partitions=10)
    assert len(slices) >= 10 and len([s for s in slices if s.queue_id == 0]) == 9
    _check_tiling([QueueSlice("T", 0, 0, 90), QueueSlice("T", 1, 0, 10)], slices, 1000)


# --- pushed filters ----------------------------------------------------------------------------
def test_exact_filters_are_taken_and_time_filters_narrow_only() -> None:
    t = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    filters = [EqualTo(("topic",), "T"), In(("queueId",), [1, 2]), GreaterThanOrEqual(("queueOffset",), 10),
               LessThan(("queueOffset",), 20), In(("tags",), ["A", "B"]), EqualTo(("tags",), "A"),
               GreaterThan(("storeTimestamp",), t), IsNotNull(("tags",)), StringStartsWith(("keys",), "k")]
    pushed, rest = push_filters(filters)
    assert pushed.topics == {"T"} and pushed.queue_ids == {1, 2}
    assert (pushed.offset_lo, pushed.offset_hi) == (10, 20)
    assert pushed.tags == {"A"}
    assert pushed.time_lo == 1700000000000 and pushed.time_hi is None
    assert rest == [filters[6], filters[7], filters[8]]  # the time filter is checked by Spark again


def test_pushed_bounds_intersect_and_select_queues() -> None:
    pushed, rest = push_filters([GreaterThan(("queueId",), 0), LessThanOrEqual(("queueId",), 2),
                                 EqualTo(("queueOffset",), 7), In(("queueOffset",), [3, 9]),
                                 LessThanOrEqual(("storeTimestamp",), datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC))])
    assert (pushed.queue_lo, pushed.queue_hi) == (1, 3)
    assert (pushed.offset_lo, pushed.offset_hi) == (7, 8)
    assert pushed.time_hi == 1001
    assert len(rest) == 2  # IN on offsets has gaps; time: Spark checks again
    assert [r.queue_id for r in plan_ranges(QUEUES[:3], "earliest", "latest", pushed=pushed)] == [1, 2]
    assert plan_ranges(QUEUES[:1], "earliest", "latest", pushed=pushed) == []
    only = Pushed(offset_lo=20, offset_hi=30)
    assert plan_ranges(QUEUES[:2], "earliest", "latest", pushed=only) == [
        QueueSlice("T", 0, 20, 30), QueueSlice("T", 1, 20, 30)]


def test_filters_that_cannot_be_pushed_go_back_to_spark() -> None:
    filters = [EqualTo(("tags",), "A||B"), EqualTo(("queueId",), "1"), EqualTo(("body",), b"x")]
    pushed, rest = push_filters(filters)
    assert rest == filters and pushed.tags is None


# --- streaming ----------------------------------------------------------------------------------
def test_initial_offsets_and_stream_ranges() -> None:
    assert initial_offsets(QUEUES, "latest") == {"T": {"0": 100, "1": 50, "2": 0}, "U": {"0": 8}}
    assert initial_offsets(QUEUES, "earliest") == {"T": {"0": 0, "1": 10, "2": 0}, "U": {"0": 5}}
    start = {"T": {"0": 40, "1": 50}}
    end = {"T": {"0": 60, "1": 50, "2": 5}}
    # A queue the start does not know (new since) is read from 0: the server clamps to its min offset.
    assert stream_ranges(start, end) == [QueueSlice("T", 0, 40, 60), QueueSlice("T", 2, 0, 5)]


def test_merge_forward_never_goes_back() -> None:
    assert merge_forward({"T": {"0": 10, "1": 5}}, {"T": {"0": 3, "2": 4}}) == {"T": {"0": 10, "1": 5, "2": 4}}


def test_rate_limit_shares_the_limit_by_backlog() -> None:
    start = {"T": {"0": 0, "1": 0, "2": 100}}
    latest = {"T": {"0": 300, "1": 100, "2": 100}}
    assert rate_limit(start, latest, 1000) == latest
    assert rate_limit(start, latest, 100) == {"T": {"0": 75, "1": 25, "2": 100}}
    # A tiny limit still moves every queue with a backlog by one.
    assert rate_limit(start, latest, 1) == {"T": {"0": 1, "1": 1, "2": 100}}
