"""A real Kafka Streams application through the proxy (issue 14): Kafka's own WordCountDemo.

The demo (from the broker version's `kafka-streams-examples` jar) runs with
`group.protocol=streams`, so it joins a KIP-1071 streams group
(StreamsGroupHeartbeat, enabled by default on the 4.3.1 broker) besides its
Fetch / Produce / changelog traffic. What must hold: its connections are
classified with the streams role live (`/clients`, `kafkatap top`), its
group is a streams group, nothing it sends is opaque, and no recorded topic is
a topic id.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from harness.java_clients import JavaClients
from proxy.metrics import LiveStats
from proxy.running import RunningProxy
from proxy.topics import is_topic_id

pytestmark = pytest.mark.kafka

INPUT, OUTPUT = "streams-plaintext-input", "streams-wordcount-output"  # fixed by WordCountDemo


def test_word_count_demo_is_a_streams_member(proxied_kafka: Any, sink: Any, tmp_path: Any, topic_name: str) -> None:
    app = f"wc-{topic_name}"[:200]
    with RunningProxy([proxied_kafka.route], sink=sink) as p:
        j = JavaClients(p.bootstrap)
        for t in (INPUT, OUTPUT):
            j.run(j.topics("--create", "--if-not-exists", "--topic", t, "--partitions", "2",
                           "--replication-factor", "1")).check()
        demo = j.word_count_demo(tmp_path / "wordcount.properties", {
            "application.id": app, "group.protocol": "streams",  # client ids: "<app>-<uuid>-StreamThread-1-…"
            "state.dir": tmp_path / "state", "commit.interval.ms": 200,
        })
        proc = j.start(demo)
        try:
            # the app is in its group (heartbeats) before the words are written: it then counts them
            sink.wait_for(lambda s: any(r["api_name"] == "StreamsGroupHeartbeat" and r["status"] == "answered"
                                        for r in s.requests), timeout=90)
            j.run(j.producer_perf(INPUT, 50, record_size=20, props={"client.id": "words"})).check()
            sink.wait_for(lambda s: any(r["api_name"] == "Produce" and OUTPUT in r["topics"]
                                        and r["client_id"].startswith(app) for r in s.requests), timeout=90)
        finally:
            proc.send_signal(signal.SIGTERM)  # the demo's shutdown hook closes the app (leaves the group)
            try:
                out, err = proc.communicate(timeout=60)
            except Exception:  # noqa: BLE001 - a hung JVM is killed, the assertions below still run
                proc.kill()
                out, err = proc.communicate()
    rows = [r for r in sink.requests if (r["client_id"] or "").startswith(app)]
    apis = {r["api_name"] for r in rows}
    print("streams app APIs:", sorted(apis))
    assert {"StreamsGroupHeartbeat", "Fetch", "Produce"} <= apis, (sorted(apis), err[-2000:])
    heartbeats = [r for r in rows if r["api_name"] == "StreamsGroupHeartbeat"]
    assert {r["group_id"] for r in heartbeats} == {app}  # the application id is the streams group
    assert all(not r["errors"] for r in heartbeats if r["status"] == "answered"), heartbeats[:3]
    # classified live: the connection that heartbeats is a streams member
    stats = LiveStats("p")
    for r in sink.requests:
        stats.request(r)
    roles = {c["conn_id"]: c["roles"] for c in stats.clients_json()["clients"]}
    member_conns = {r["conn_id"] for r in heartbeats}
    assert member_conns and all("streams-member" in roles[c] for c in member_conns), roles
    # nothing opaque, no topic left as an id (after the late resolution analytics applies)
    assert [(r["api_name"], r["api_version"], r["decode_note"]) for r in rows if r["decode_note"]] == []
    names = sink.topic_names()
    assert [(r["api_name"], r["topics"]) for r in rows if any(is_topic_id(names.get(t, t)) for t in r["topics"])] == []
    touched = {names.get(t, t) for r in rows if r["api_name"] in ("Produce", "Fetch") for t in r["topics"]}
    assert {INPUT, OUTPUT} <= touched, touched
