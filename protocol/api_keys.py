"""Kafka's API vocabulary: key numbers, names, and which side sends which request. No specs loaded.

Why apart from `protocol.apis`: that module loads Kafka's message specs (the codec's tables) at import;
these are the words every layer uses, the analysis's too, which reads Kafka's vocabulary and never the
codec (tests/test_layout.py). `protocol.apis` re-exports every name here, so code keeps importing them
from there.
"""

from __future__ import annotations

__all__ = [
    "API_NAMES", "PRODUCE", "FETCH", "LIST_OFFSETS", "METADATA", "CONTROLLED_SHUTDOWN", "OFFSET_COMMIT",
    "OFFSET_FETCH", "FIND_COORDINATOR", "JOIN_GROUP", "HEARTBEAT", "LEAVE_GROUP", "SYNC_GROUP",
    "SASL_HANDSHAKE", "API_VERSIONS", "CREATE_TOPICS", "DELETE_TOPICS", "INIT_PRODUCER_ID",
    "ADD_PARTITIONS_TO_TXN", "ADD_OFFSETS_TO_TXN", "END_TXN", "TXN_OFFSET_COMMIT", "SASL_AUTHENTICATE", "OFFSET_FOR_LEADER_EPOCH", "DESCRIBE_CLUSTER",
    "DESCRIBE_TRANSACTIONS", "CONSUMER_GROUP_HEARTBEAT", "DESCRIBE_TOPIC_PARTITIONS", "SHARE_GROUP_HEARTBEAT",
    "SHARE_FETCH", "SHARE_ACKNOWLEDGE", "STREAMS_GROUP_HEARTBEAT", "GROUP_HEARTBEATS", "CREDENTIAL_APIS",
    "CREDENTIAL_API_NAMES", "BROKER_SENT_APIS", "BROKER_ADD_PARTITIONS_MIN_VERSION", "REPLICA_ID_APIS",
    "FOLLOWER_CLIENT_ID_PATTERN", "ANY_CONNECTION_APIS", "KIP_896_REFUSAL"
]

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
CONTROLLED_SHUTDOWN, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 7, 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
SASL_HANDSHAKE, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 17, 18, 19, 20
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN, SASL_AUTHENTICATE = 22, 24, 26, 36
ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT = 25, 28
OFFSET_FOR_LEADER_EPOCH = 23
DESCRIBE_CLUSTER, DESCRIBE_TRANSACTIONS, CONSUMER_GROUP_HEARTBEAT = 60, 65, 68
DESCRIBE_TOPIC_PARTITIONS, SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE = 75, 76, 78, 79
STREAMS_GROUP_HEARTBEAT = 88
# The newer group protocols' heartbeats (KIP-848, KIP-932, KIP-1071): each carries its member's id and epoch
GROUP_HEARTBEATS = frozenset({CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT, STREAMS_GROUP_HEARTBEAT})
# Frames that may carry a secret in either direction, never kept as bytes (`--capture`): SaslAuthenticate's
# token; AlterConfigs and IncrementalAlterConfigs (33, 44), whose values are sent in clear, passwords included
# (a listener's sasl.jaas.config with every user's password, ssl.keystore.password); a delegation token's HMAC
# (created, described, renewed, expired: 38-41; the HMAC is the token's password); AlterUserScramCredentials'
# salt and salted password (51: enough to log in with SCRAM, or to brute-force offline); and Envelope (58),
# which carries another principal's request, any of these included.
CREDENTIAL_APIS = frozenset({33, SASL_AUTHENTICATE, 38, 39, 40, 41, 44, 51, 58})
CREDENTIAL_API_NAMES = ("SaslAuthenticate, AlterConfigs, IncrementalAlterConfigs, the delegation-token APIs, "
                        "AlterUserScramCredentials and Envelope")
# Requests that only a broker or a controller ever sends, never a client: replication control (LeaderAndIsr,
# StopReplica, UpdateMetadata, ControlledShutdown, AlterPartition), transaction markers (WriteTxnMarkers), KRaft's
# quorum and registrations (Vote, BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot, BrokerRegistration,
# BrokerHeartbeat, ControllerRegistration, UpdateRaftVoter, AllocateProducerIds, AssignReplicasToDirs), a forwarded
# request (Envelope) and the share coordinator's state (83-87). Kafka's ApiKeys marks most of them "clusterAction":
# the receiver checks the sender's CLUSTER_ACTION permission, which a client principal does not have. A proxy on a
# listener the brokers also use between themselves (one listener for all, advertised as the proxy) records them.
BROKER_SENT_APIS = frozenset({4, 5, 6, 7, 27, 52, 53, 54, 56, 58, 59, 62, 63, 67, 70, 73, 82, 83, 84, 85, 86, 87})
# AddPartitionsToTxn v4+ is the brokers' form (KIP-890: a partition leader asks the transaction coordinator to
# verify a batch of transactions); "versions 3 and below will be exclusively used by clients", says its spec.
BROKER_ADD_PARTITIONS_MIN_VERSION = 4
# Fetch and OffsetForLeaderEpoch name the replica that sends them: a follower broker's id (>= 0); a consumer sends
# -1 (or -2, a debugging tool).
REPLICA_ID_APIS = frozenset({FETCH, OFFSET_FOR_LEADER_EPOCH})
# A follower broker's Fetch and OffsetForLeaderEpoch come from its replica fetcher, whose client id Kafka builds as
# "broker-<its id>-fetcher-<n>": where only the rows are at hand (the live view, the analysis: neither decodes the
# replica id), that client id is what tells a follower from a consumer
FOLLOWER_CLIENT_ID_PATTERN = r"^broker-\d+-fetcher-\d+"
# What any connection sends, a broker's own as a client's: they say nothing about which of the two it is
ANY_CONNECTION_APIS = frozenset({API_VERSIONS, FIND_COORDINATOR, SASL_HANDSHAKE, SASL_AUTHENTICATE})
# How the proxy's inferred cause names a 4.x broker's refusal of a request version Kafka 4.0 removed (KIP-896;
# proxy.inference), and how the analysis counts those closes (analytics.transforms.connections.kafka_4_upgrade)
KIP_896_REFUSAL = "a version Kafka 4.0 removed"
