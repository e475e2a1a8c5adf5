"""The cause pickers of harness.broker_log on logs shaped as a broker writes them (what no live broker does on cue:
a halt on a failed log dir, an error long before the stop, a JVM that printed an OutOfMemoryError)."""

from __future__ import annotations

from harness.broker_log import BrokerStop, broker_stop, remedy, stalled_start

STARTED = "[2026-01-02 10:00:00,001] INFO [KafkaRaftServer nodeId=1] Kafka Server started (kafka.server.KafkaRaftServer)\n"


def test_a_halt_is_named_by_its_last_error_not_an_earlier_one() -> None:
    log = (STARTED
           + "[2026-01-02 11:00:00,000] ERROR [ReplicaManager broker=1] Error processing append operation on partition "
             "t-0 (kafka.server.ReplicaManager)\n"
           + "[2026-01-02 12:00:00,000] INFO Rolled new log segment for t-0 (kafka.log.LocalLog)\n"
           + "[2026-01-02 13:30:00,500] ERROR Shutdown broker because all log dirs in /d have failed (kafka.log.LogManager)\n")
    assert broker_stop(log) == BrokerStop("Shutdown broker because all log dirs in /d have failed", "2026-01-02 13:30:00")


def test_an_error_before_the_shutdown_is_why_not_the_shutdowns_own() -> None:
    log = (STARTED
           + "[2026-01-02 13:00:00,000] ERROR Uncaught exception (kafka.Thing)\n"
             "java.lang.IllegalStateException: the controller fenced this broker\n"
             "\tat kafka.Thing.run(Thing.java:1)\n"
           + "[2026-01-02 13:00:01,000] INFO [BrokerServer id=1] Transition from STARTED to SHUTTING_DOWN (x.Y)\n"
           + "[2026-01-02 13:00:02,000] ERROR Error closing a thing during shutdown (x.Z)\n")
    assert broker_stop(log) == BrokerStop("java.lang.IllegalStateException: the controller fenced this broker",
                                          "2026-01-02 13:00:00")


def test_what_the_jvm_printed_names_a_stop_its_log_does_not() -> None:
    stop = broker_stop(STARTED, "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space\n")
    assert stop == BrokerStop('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space',
                              "2026-01-02 10:00:00", exact=False)
    assert remedy(stop.cause).startswith("the broker ran out of heap")


def test_a_bad_property_is_named_for_the_command_line_and_for_a_scenario() -> None:
    """A scenario's Broker(props=…) was told to 'fix or drop the --prop it names', an option it never gave."""
    said = remedy("org.apache.kafka.common.config.ConfigException: Invalid value ten for configuration message.max.bytes")
    assert said == "fix or drop the broker property it names (--prop, or a scenario's Broker(props=…))"


def test_a_slow_start_is_no_stall_and_the_warning_it_keeps_repeating_is() -> None:
    warning = "[2026-01-02 10:00:0{i},000] WARN [RaftManager id=1] Connection to node {n} could not be established. (x)\n"
    assert stalled_start("".join(warning.format(i=i, n=2) for i in range(2))) is None
    # its own controller, a few times until its listener is up, then the voter it waits on: that one is why
    log = "".join(warning.format(i=i, n=n) for i, n in enumerate([1, 2, 1, 1, 2, 2]))
    assert stalled_start(log) == (
        "it kept warning (3 times): [RaftManager id=1] Connection to node 2 could not be established.")
