"""Test and benchmark infrastructure that is real, not mocked.

A Maven-fetched Apache Kafka broker (KRaft) on loopback, the jars it needs,
network namespaces with their own addresses, and one raw wire client. The
scenarios, the tests and the benchmarks all start brokers and hosts through
this package, so there is exactly one way to do it.
"""
