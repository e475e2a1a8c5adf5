"""Sans-I/O Kafka wire protocol: everything the project knows about Kafka's bytes.

Nothing in this package touches sockets, asyncio or clocks: callers feed bytes
and timestamps in and take events (or bytes) out.

stream.py             KafkaStream, the per-connection decoder the proxy runs (state: stream_state.py)
framing.py, events.py size prefixes and memory bounds; the events and summaries KafkaStream emits
headers.py, apis.py   request/response headers, API keys, names and flexible versions from the specs
generated/specs.json  Kafka's JSON message specs (4.3.1, with 3.7.2 for dropped versions), committed
spec_gen.py           `python -m protocol.spec_gen`: regenerates generated/specs.json from the Maven-fetched specs
summaries/            schema-generated walkers that summarize bodies on the hot path
records.py            record-batch headers as read on the hot path; the v2 header layout
codec.py              full decode/encode of bodies, driven by the committed specs
deep.py               full decode and encode of whole frames (dict bodies), off the hot path
frames.py             whole-frame edits: correlation ids, Produce acks, response bodies, Fetch sessions
batch_edit.py         v2 record-batch header edits with the CRC-32C recomputed
consumer_protocol.py  topic renames inside classic consumer-group metadata
errors.py             the exceptions protocol/ raises, and Kafka's error-code names
"""
