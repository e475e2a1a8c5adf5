"""Test and benchmark infrastructure that is real, not mocked.

A Maven-fetched Apache Kafka broker (KRaft) on loopback, the jars it needs,
network namespaces with their own addresses, and one raw wire client. The
scenarios, the tests and the benchmarks all start brokers and hosts through
this package, so there is exactly one way to do it.

jars.py   pinned Kafka releases fetched with Maven (`python -m harness.jars`, run by `./go setup`)
kafka.py  LocalKafka: one broker or a 3-node KRaft cluster; readiness probes
netns.py  test hosts in network namespaces, wired with veth pairs, always torn down
wire.py   WireClient / AsyncWireClient: requests from protocol's encoders, answers decoded by it (SASL/PLAIN first on request)

Nothing in protocol/, proxy/, recording/ or analytics/ imports this package.
"""
