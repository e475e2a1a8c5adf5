"""API key → name, decodable versions and flexible versions.

Why from the schemas: which versions use compact encodings and tagged fields
(and therefore request header v2 / response header v1) is defined by each
message's `flexibleVersions` in Kafka's JSON specs. kafka-python 3.x ships
those specs; we load them once at import and never hand-type version tables.

Kafka 4.0 raised the minimum versions of many APIs (e.g. Produce 3+); the
field `versions` in the specs still describe the older layouts, so like
kafka-python we treat every version from 0 to the spec's maximum as decodable.
API keys without a bundled schema get a name from the hand table below and are
kept as opaque frames (header fields, sizes, timestamps, pairing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka.protocol.schemas import load_json

# Names of every API key Kafka has assigned (org.apache.kafka.common.protocol.ApiKeys),
# including the ones kafka-python has no schema for (KRaft/controller, share
# groups, streams groups, telemetry, …).
API_NAMES: dict[int, str] = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 4: "LeaderAndIsr",
    5: "StopReplica", 6: "UpdateMetadata", 7: "ControlledShutdown", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics",
    21: "DeleteRecords", 22: "InitProducerId", 23: "OffsetForLeaderEpoch",
    24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn", 27: "WriteTxnMarkers",
    28: "TxnOffsetCommit", 29: "DescribeAcls", 30: "CreateAcls", 31: "DeleteAcls",
    32: "DescribeConfigs", 33: "AlterConfigs", 34: "AlterReplicaLogDirs",
    35: "DescribeLogDirs", 36: "SaslAuthenticate", 37: "CreatePartitions",
    38: "CreateDelegationToken", 39: "RenewDelegationToken", 40: "ExpireDelegationToken",
    41: "DescribeDelegationToken", 42: "DeleteGroups", 43: "ElectLeaders",
    44: "IncrementalAlterConfigs", 45: "AlterPartitionReassignments",
    46: "ListPartitionReassignments", 47: "OffsetDelete", 48: "DescribeClientQuotas",
    49: "AlterClientQuotas", 50: "DescribeUserScramCredentials",
    51: "AlterUserScramCredentials", 52: "Vote", 53: "BeginQuorumEpoch",
    54: "EndQuorumEpoch", 55: "DescribeQuorum", 56: "AlterPartition", 57: "UpdateFeatures",
    58: "Envelope", 59: "FetchSnapshot", 60: "DescribeCluster", 61: "DescribeProducers",
    62: "BrokerRegistration", 63: "BrokerHeartbeat", 64: "UnregisterBroker",
    65: "DescribeTransactions", 66: "ListTransactions", 67: "AllocateProducerIds",
    68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe", 70: "ControllerRegistration",
    71: "GetTelemetrySubscriptions", 72: "PushTelemetry", 73: "AssignReplicasToDirs",
    74: "ListConfigResources", 75: "DescribeTopicPartitions", 76: "ShareGroupHeartbeat",
    77: "ShareGroupDescribe", 78: "ShareFetch", 79: "ShareAcknowledge", 80: "AddRaftVoter",
    81: "RemoveRaftVoter", 82: "UpdateRaftVoter", 83: "InitializeShareGroupState",
    84: "ReadShareGroupState", 85: "WriteShareGroupState", 86: "DeleteShareGroupState",
    87: "ReadShareGroupStateSummary", 88: "StreamsGroupHeartbeat", 89: "StreamsGroupDescribe",
    90: "DescribeShareGroupOffsets", 91: "AlterShareGroupOffsets",
    92: "DeleteShareGroupOffsets",
}

# The API keys code refers to by name (the rest are only ever looked up in the
# tables above). Defined once, here: a second copy elsewhere is a second place
# for a typo that the broker would answer with a confusing error.
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
SASL_HANDSHAKE, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 17, 18, 19, 20
INIT_PRODUCER_ID, SASL_AUTHENTICATE = 22, 36
# APIs that name a consumer group (classic protocol) in their request.
GROUP_APIS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP})

# Flexible-from versions for keys without a bundled schema, so that their
# request header (v2 when flexible) can still be read to the end. Everything
# newer than ~2.4 is flexible from version 0.
_FLEXIBLE_FROM_NO_SCHEMA: dict[int, int] = {
    4: 4, 5: 2, 6: 6, 7: 3, 38: 2, 39: 2, 40: 2, 41: 2,
}


def parse_versions(text: object) -> tuple[int, int] | None:
    """Kafka version-range syntax: "3+", "0-4", "5", "none" (schemas and their fields alike)."""
    if text is None or not str(text).strip() or str(text).strip() == "none":
        return None
    text = str(text).strip()
    if text.endswith("+"):
        return int(text[:-1]), 0x7FFF
    if "-" in text:
        lo, hi = text.split("-")
        return int(lo), int(hi)
    return int(text), int(text)


@dataclass(frozen=True, slots=True)
class ApiInfo:
    """What the decoder knows about one API key."""

    key: int
    name: str
    max_version: int  # highest version a schema describes; -1 without schema
    flexible_from: int  # first flexible version (0x7FFF: never flexible)
    request_schema: dict[str, Any] | None
    response_schema: dict[str, Any] | None

    @property
    def has_schema(self) -> bool:
        return self.request_schema is not None

    def decodable(self, version: int) -> bool:
        """A schema describes this version (0 .. max: see module docstring)."""
        return self.request_schema is not None and 0 <= version <= self.max_version

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_from


def _load_all() -> dict[int, ApiInfo]:
    infos: dict[int, ApiInfo] = {}
    for key, name in API_NAMES.items():
        try:
            req = load_json(name + "Request")
            resp = load_json(name + "Response")
        except (FileNotFoundError, ModuleNotFoundError, OSError):
            req = resp = None
        if req is not None and resp is not None:
            valid = parse_versions(req["validVersions"]) or (0, -1)
            flex = parse_versions(req.get("flexibleVersions"))
            infos[key] = ApiInfo(key, name, valid[1], flex[0] if flex else 0x7FFF, req, resp)
        else:
            infos[key] = ApiInfo(key, name, -1, _FLEXIBLE_FROM_NO_SCHEMA.get(key, 0), None, None)
    return infos


APIS: dict[int, ApiInfo] = _load_all()


def api_name(key: int) -> str:
    info = APIS.get(key)
    return info.name if info is not None else f"Unknown{key}"


def api_info(key: int) -> ApiInfo | None:
    return APIS.get(key)
