"""Reproductions on this machine: a Maven-fetched Kafka broker, network namespaces, the incident catalog, replay."""
