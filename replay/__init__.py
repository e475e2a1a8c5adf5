"""Replay recorded Kafka sessions on the wire against another broker (issue 8).

load.py        recording → filtered connections/requests with their recorded rhythm
topics.py      which topics a request names (plan, topic creation, --topic filter); --topic-map
state.py       what the replay learned of the target, and the outcomes (Send / Skip / Pending)
messages.py    request bodies as mutable message objects (the only use of the schema codec's objects)
walk.py        the generic rewrite: topic names/ids, member ids, generations and member epochs,
               producer ids and epochs in any API
rewrite.py     rewrite_request: the generic walk + per-API parts (Produce batches, fetch sessions,
               joins, group metadata, KIP-848 heartbeats, SASL)
learn.py       learn_from_response: the target's answers → state
target.py      get the target ready (topics, leaders, coordinators, producer ids) over harness.wire,
               SASL/PLAIN first with --sasl-plain; one line for a target that refuses or hangs up
schedule.py    options, totals and the schedule every connection follows (recorded clock or --speed max)
connection.py  one recorded connection replayed on one TCP connection
engine.py      runs the connections on the schedule, progress, optional recording proxy
cli.py         `kafkatap replay`

Wire knowledge (frames, correlation ids, acks, record batches, consumer
protocol) is in `protocol/`; nothing here packs bytes by hand.
"""
