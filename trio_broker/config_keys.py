"""The one table of broker config keys: every key of Kafka 4's broker documentation, and ours.

Each key has Kafka's type and default and our status: ``APPLIED`` (the broker acts
on it, through the :class:`~trio_broker.config.BrokerConfig` field named here) or
``INERT`` (accepted so that one ``server.properties`` drives Kafka and trio-broker
alike, with a warning naming the key, because it has no effect here). A key not in
the table is an error.

The Kafka rows list the public (non-internal) keys of Kafka 4.4.0's broker
``ConfigDef`` (``AbstractKafkaConfig.CONFIG_DEF``, which Kafka's broker config
documentation is generated from), with their types and defaults as Kafka prints
them. ``super.users`` and ``allow.everyone.if.no.acl.found`` belong to Kafka's
authorizer; the ``ours`` rows are trio-broker's own keys. docs/configuration.md
lists the table (a test keeps it in step).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from trio_broker.config_errors import ConfigError
from trio_broker.storage.topic_configs import (
    BOOLEAN,
    CLASS,
    DOUBLE,
    INT,
    LIST,
    LONG,
    PASSWORD,
    SHORT,
    STRING,
)

__all__ = [
    "APPLIED",
    "BROKER_KEYS",
    "INERT",
    "SECURITY",
    "SYNONYMS",
    "BrokerKey",
    "inert_reason",
    "lookup",
    "parse_value",
]

APPLIED = "applied"
INERT = "inert"
#: ``BrokerKey.field`` of TLS/SASL keys: their values live in ``BrokerConfig.security``,
#: global or per listener (``listener.name.<name>.<key>``), see security/listeners.py.
SECURITY = "security"

TYPE_NAMES = {BOOLEAN: "boolean", STRING: "string", INT: "int", SHORT: "short", LONG: "long",
              DOUBLE: "double", LIST: "list", CLASS: "class", PASSWORD: "password"}  # fmt: skip


@attrs.frozen
class BrokerKey:
    name: str
    #: Kafka's ConfigDef type code (DescribeConfigs' config_type).
    type: int
    #: Kafka's default as its documentation prints it; None: no default (null or required).
    kafka_default: str | None
    status: str = INERT
    #: The BrokerConfig field an APPLIED key sets, SECURITY, or None when load_config
    #: handles the key itself (listeners, controller.listener.names, ...).
    field: str | None = None
    #: The key's unit in the field's unit: log.retention.hours sets retention_ms * 3600000.
    scale: int = 1
    #: "kafka", "kafka-internal" (an internal key of Kafka's, accepted by its brokers
    #: but not documented), "authorizer" (Kafka's StandardAuthorizer) or "ours".
    origin: str = "kafka"

    @property
    def sensitive(self) -> bool:
        """Kafka never shows a password's value (DescribeConfigs answers null)."""
        return self.type == PASSWORD


def _key(name: str, type_: int, kafka_default: str | None, status: str = INERT,
         field: str | None = None, *, scale: int = 1, origin: str = "kafka") -> BrokerKey:  # fmt: skip
    return BrokerKey(name, type_, kafka_default, status, field, scale, origin)


# fmt: off
_KAFKA_KEYS = [
    _key("add.partitions.to.txn.retry.backoff.max.ms", INT, "100"),
    _key("add.partitions.to.txn.retry.backoff.ms", INT, "20"),
    _key("advertised.listeners", LIST, None, APPLIED),
    _key("alter.config.policy.class.name", CLASS, None),
    _key("alter.log.dirs.replication.quota.window.num", INT, "11"),
    _key("alter.log.dirs.replication.quota.window.size.seconds", INT, "1"),
    _key("authorizer.class.name", STRING, "", APPLIED, "authorizer_class_name"),
    _key("auto.create.topics.enable", BOOLEAN, "true", APPLIED, "auto_create_topics"),
    _key("auto.leader.rebalance.enable", BOOLEAN, "true", APPLIED, "auto_leader_rebalance_enable"),
    _key("background.threads", INT, "10"),
    _key("broker.heartbeat.interval.ms", INT, "2000"),
    _key("broker.id", INT, "-1", APPLIED, "node_id"),
    _key("broker.rack", STRING, None, APPLIED, "broker_rack"),
    _key("broker.session.timeout.ms", INT, "9000"),
    _key("client.quota.callback.class", CLASS, None),
    _key("compression.gzip.level", INT, "-1"),
    _key("compression.lz4.level", INT, "9"),
    _key("compression.type", STRING, "producer"),
    _key("compression.zstd.level", INT, "3"),
    _key("config.providers", LIST, ""),
    _key("connection.failed.authentication.delay.ms", INT, "100", APPLIED,
         "connection_failed_authentication_delay_ms"),
    _key("connections.max.idle.ms", LONG, "600000", APPLIED, "connections_max_idle_ms"),
    _key("connections.max.reauth.ms", LONG, "0", APPLIED, SECURITY),
    _key("controlled.shutdown.enable", BOOLEAN, "true"),
    _key("controller.listener.names", LIST, None, APPLIED),
    _key("controller.quorum.append.linger.ms", INT, "25"),
    _key("controller.quorum.auto.join.enable", BOOLEAN, "false"),
    _key("controller.quorum.bootstrap.servers", LIST, ""),
    _key("controller.quorum.election.backoff.max.ms", INT, "1000"),
    _key("controller.quorum.election.timeout.ms", INT, "1000"),
    _key("controller.quorum.fetch.max.bytes", INT, "1048576"),
    _key("controller.quorum.fetch.snapshot.max.bytes", INT, "1048576"),
    _key("controller.quorum.fetch.timeout.ms", INT, "2000"),
    _key("controller.quorum.request.timeout.ms", INT, "2000"),
    _key("controller.quorum.retry.backoff.ms", INT, "20"),
    _key("controller.quorum.voters", LIST, ""),
    _key("controller.quota.window.num", INT, "11"),
    _key("controller.quota.window.size.seconds", INT, "1"),
    _key("controller.socket.timeout.ms", INT, "30000"),
    _key("cordoned.log.dirs", LIST, ""),
    _key("create.topic.policy.class.name", CLASS, None),
    _key("default.replication.factor", INT, "1", APPLIED, "default_replication_factor"),
    _key("delegation.token.expiry.check.interval.ms", LONG, "3600000"),
    _key("delegation.token.expiry.time.ms", LONG, "86400000"),
    _key("delegation.token.max.lifetime.ms", LONG, "604800000"),
    _key("delegation.token.secret.key", PASSWORD, None),
    _key("delete.records.purgatory.purge.interval.requests", INT, "1"),
    _key("delete.topic.enable", BOOLEAN, "true", APPLIED, "delete_topic_enable"),
    _key("early.start.listeners", LIST, None),
    _key("errors.deadletterqueue.auto.create.topics.enable", BOOLEAN, "false"),
    _key("errors.deadletterqueue.topic.name.prefix", STRING, "dlq."),
    _key("fetch.max.bytes", INT, "57671680"),
    _key("fetch.purgatory.purge.interval.requests", INT, "1000"),
    _key("follower.fetch.last.tiered.offset.enable", BOOLEAN, "false"),
    _key("group.consumer.assignment.interval.ms", INT, "1000"),
    _key("group.consumer.assignors", LIST, "uniform,range", APPLIED, "group_consumer_assignors"),
    _key("group.consumer.heartbeat.interval.ms", INT, "5000", APPLIED, "group_consumer_heartbeat_interval_ms"),
    _key("group.consumer.max.assignment.interval.ms", INT, "15000"),
    _key("group.consumer.max.heartbeat.interval.ms", INT, "15000", APPLIED),  # a group config's bound
    _key("group.consumer.max.session.timeout.ms", INT, "60000", APPLIED),  # a group config's bound
    _key("group.consumer.max.size", INT, "2147483647"),
    _key("group.consumer.migration.policy", STRING, "bidirectional", APPLIED, "group_consumer_migration_policy"),
    _key("group.consumer.min.assignment.interval.ms", INT, "0"),
    _key("group.consumer.min.heartbeat.interval.ms", INT, "5000", APPLIED),  # a group config's bound
    _key("group.consumer.min.session.timeout.ms", INT, "45000", APPLIED),  # a group config's bound
    _key("group.consumer.session.timeout.ms", INT, "45000", APPLIED, "group_consumer_session_timeout_ms"),
    _key("group.coordinator.append.linger.ms", INT, "-1"),
    _key("group.coordinator.background.threads", INT, "2"),
    _key("group.coordinator.cached.buffer.max.bytes", INT, "1048588"),
    _key("group.coordinator.rebalance.protocols", LIST, "classic,consumer,streams"),
    _key("group.coordinator.threads", INT, "4"),
    _key("group.initial.rebalance.delay.ms", INT, "3000", APPLIED, "group_initial_rebalance_delay_ms"),
    _key("group.max.session.timeout.ms", INT, "1800000", APPLIED, "group_max_session_timeout_ms"),
    _key("group.max.size", INT, "2147483647"),
    _key("group.min.session.timeout.ms", INT, "6000", APPLIED, "group_min_session_timeout_ms"),
    _key("group.share.assignment.interval.ms", INT, "1000"),
    _key("group.share.assignors", LIST, "simple"),
    _key("group.share.delivery.count.limit", INT, "5", APPLIED, "group_share_delivery_count_limit"),
    _key("group.share.heartbeat.interval.ms", INT, "5000", APPLIED, "group_share_heartbeat_interval_ms"),
    _key("group.share.max.assignment.interval.ms", INT, "15000"),
    _key("group.share.max.delivery.count.limit", INT, "10", APPLIED),  # a group config's bound
    _key("group.share.max.heartbeat.interval.ms", INT, "15000", APPLIED),  # a group config's bound
    _key("group.share.max.partition.max.record.locks", INT, "4000", APPLIED),  # a group config's bound
    _key("group.share.max.record.lock.duration.ms", INT, "60000", APPLIED),  # a group config's bound
    _key("group.share.max.session.timeout.ms", INT, "60000", APPLIED),  # a group config's bound
    _key("group.share.max.share.sessions", INT, "2000"),
    _key("group.share.max.size", INT, "200"),
    _key("group.share.min.assignment.interval.ms", INT, "0"),
    _key("group.share.min.delivery.count.limit", INT, "2", APPLIED),  # a group config's bound
    _key("group.share.min.heartbeat.interval.ms", INT, "5000", APPLIED),  # a group config's bound
    _key("group.share.min.partition.max.record.locks", INT, "100", APPLIED),  # a group config's bound
    _key("group.share.min.record.lock.duration.ms", INT, "15000", APPLIED),  # a group config's bound
    _key("group.share.min.session.timeout.ms", INT, "45000", APPLIED),  # a group config's bound
    _key("group.share.partition.max.record.locks", INT, "2000", APPLIED, "group_share_partition_max_record_locks"),
    _key("group.share.record.lock.duration.ms", INT, "30000", APPLIED, "group_share_record_lock_duration_ms"),
    _key("group.share.session.timeout.ms", INT, "45000", APPLIED, "group_share_session_timeout_ms"),
    _key("group.streams.assignment.interval.ms", INT, "1000"),
    _key("group.streams.assignors", LIST, "sticky"),
    _key("group.streams.heartbeat.interval.ms", INT, "5000"),
    _key("group.streams.initial.rebalance.delay.ms", INT, "3000"),
    _key("group.streams.max.assignment.interval.ms", INT, "15000"),
    _key("group.streams.max.heartbeat.interval.ms", INT, "15000"),
    _key("group.streams.max.session.timeout.ms", INT, "60000"),
    _key("group.streams.max.size", INT, "2147483647"),
    _key("group.streams.max.standby.replicas", INT, "2"),
    _key("group.streams.min.assignment.interval.ms", INT, "0"),
    _key("group.streams.min.heartbeat.interval.ms", INT, "5000"),
    _key("group.streams.min.session.timeout.ms", INT, "45000"),
    _key("group.streams.num.standby.replicas", INT, "0"),
    _key("group.streams.rack.aware.assignment.tags", LIST, ""),
    _key("group.streams.session.timeout.ms", INT, "45000"),
    _key("group.streams.topology.description.plugin.class", CLASS, None),
    _key("initial.broker.registration.timeout.ms", INT, "60000"),
    _key("inter.broker.listener.name", STRING, None, APPLIED, "inter_broker_listener_name"),
    _key("kafka.metrics.polling.interval.secs", INT, "10"),
    _key("kafka.metrics.reporters", LIST, ""),
    _key("leader.imbalance.check.interval.seconds", LONG, "300", APPLIED,
         "leader_imbalance_check_interval_seconds"),
    _key("listener.security.protocol.map", STRING, "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT", APPLIED, "listener_security_protocol_map"),
    _key("listeners", LIST, "PLAINTEXT://:9092", APPLIED),
    _key("log.cleaner.backoff.ms", LONG, "15000", APPLIED, "log_cleaner_backoff_ms"),
    _key("log.cleaner.dedupe.buffer.size", LONG, "134217728", APPLIED, "log_cleaner_dedupe_buffer_size"),
    _key("log.cleaner.delete.retention.ms", LONG, "86400000", APPLIED, "log_cleaner_delete_retention_ms"),
    _key("log.cleaner.enable", BOOLEAN, "true", APPLIED, "log_cleaner_enable"),
    _key("log.cleaner.io.buffer.load.factor", DOUBLE, "0.9"),
    _key("log.cleaner.io.buffer.size", INT, "524288"),
    _key("log.cleaner.io.max.bytes.per.second", DOUBLE, "1.7976931348623157E308", APPLIED, "log_cleaner_io_max_bytes_per_second"),
    _key("log.cleaner.max.compaction.lag.ms", LONG, "9223372036854775807", APPLIED, "log_cleaner_max_compaction_lag_ms"),
    _key("log.cleaner.min.cleanable.ratio", DOUBLE, "0.5", APPLIED, "log_cleaner_min_cleanable_ratio"),
    _key("log.cleaner.min.compaction.lag.ms", LONG, "0", APPLIED, "log_cleaner_min_compaction_lag_ms"),
    _key("log.cleaner.threads", INT, "1"),
    _key("log.cleanup.policy", LIST, "delete", APPLIED, "log_cleanup_policy"),
    _key("log.dir", LIST, "/tmp/kafka-logs", APPLIED, "data_dir"),
    _key("log.dir.failure.timeout.ms", LONG, "30000"),
    _key("log.dirs", LIST, None, APPLIED, "data_dir"),
    _key("log.flush.interval.messages", LONG, "9223372036854775807", APPLIED, "flush_interval_messages"),
    _key("log.flush.interval.ms", LONG, None, APPLIED, "flush_interval_ms"),
    _key("log.flush.offset.checkpoint.interval.ms", INT, "60000"),
    _key("log.flush.scheduler.interval.ms", LONG, "9223372036854775807"),
    _key("log.flush.start.offset.checkpoint.interval.ms", INT, "60000"),
    _key("log.index.interval.bytes", INT, "4096"),
    _key("log.index.size.max.bytes", INT, "10485760"),
    _key("log.local.retention.bytes", LONG, "-2"),
    _key("log.local.retention.ms", LONG, "-2"),
    _key("log.message.timestamp.after.max.ms", LONG, "3600000"),
    _key("log.message.timestamp.before.max.ms", LONG, "9223372036854775807"),
    _key("log.message.timestamp.type", STRING, "CreateTime", APPLIED, "log_message_timestamp_type"),
    _key("log.preallocate", BOOLEAN, "false"),
    _key("log.remote.copy.lag.bytes", LONG, "-1"),
    _key("log.remote.copy.lag.ms", LONG, "0"),
    _key("log.retention.bytes", LONG, "-1", APPLIED, "retention_bytes"),
    _key("log.retention.check.interval.ms", LONG, "300000", APPLIED, "retention_check_interval_ms"),
    _key("log.retention.hours", INT, "168", APPLIED, "retention_ms", scale=3_600_000),
    _key("log.retention.minutes", INT, None, APPLIED, "retention_ms", scale=60_000),
    _key("log.retention.ms", LONG, None, APPLIED, "retention_ms"),
    _key("log.roll.hours", INT, "168", APPLIED, "segment_ms", scale=3_600_000),
    _key("log.roll.jitter.hours", INT, "0"),
    _key("log.roll.jitter.ms", LONG, None),
    _key("log.roll.ms", LONG, None, APPLIED, "segment_ms"),
    _key("log.segment.bytes", INT, "1073741824", APPLIED, "segment_bytes"),
    _key("log.segment.delete.delay.ms", LONG, "60000"),
    _key("max.connection.creation.rate", INT, "2147483647"),
    _key("max.connections", INT, "2147483647", APPLIED, "max_connections"),
    _key("max.connections.per.ip", INT, "2147483647", APPLIED, "max_connections_per_ip"),
    _key("max.connections.per.ip.overrides", STRING, ""),
    _key("max.decompressed.message.bytes", INT, "2147483639"),
    _key("max.incremental.fetch.session.cache.slots", INT, "1000", APPLIED,
         "max_incremental_fetch_session_cache_slots"),
    _key("max.request.partition.size.limit", INT, "2000", APPLIED,
         "max_request_partition_size_limit"),
    _key("message.max.bytes", INT, "1048588", APPLIED, "message_max_bytes"),
    _key("metadata.log.dir", STRING, None),
    _key("metadata.log.max.record.bytes.between.snapshots", LONG, "20971520"),
    _key("metadata.log.max.snapshot.interval.ms", LONG, "3600000"),
    _key("metadata.log.segment.bytes", INT, "1073741824"),
    _key("metadata.log.segment.ms", LONG, "604800000"),
    _key("metadata.max.idle.interval.ms", INT, "500"),
    _key("metadata.max.retention.bytes", LONG, "104857600"),
    _key("metadata.max.retention.ms", LONG, "604800000"),
    _key("metric.reporters", LIST, "org.apache.kafka.common.metrics.JmxReporter"),
    _key("metrics.num.samples", INT, "2"),
    _key("metrics.recording.level", STRING, "INFO"),
    _key("metrics.sample.window.ms", LONG, "30000"),
    _key("min.insync.replicas", INT, "1", APPLIED, "min_insync_replicas"),
    _key("node.id", INT, None, APPLIED, "node_id"),
    _key("num.io.threads", INT, "8", APPLIED, "num_handlers"),
    _key("num.network.threads", INT, "3"),
    _key("num.partitions", INT, "1", APPLIED, "num_partitions"),
    _key("num.recovery.threads.per.data.dir", INT, "2"),
    _key("num.replica.alter.log.dirs.threads", INT, None),
    _key("num.replica.fetchers", INT, "1"),
    _key("offset.metadata.max.bytes", INT, "4096"),
    _key("offsets.commit.timeout.ms", INT, "5000", APPLIED, "offsets_commit_timeout_ms"),
    _key("offsets.load.buffer.size", INT, "5242880"),
    _key("offsets.retention.check.interval.ms", LONG, "600000"),
    _key("offsets.retention.minutes", INT, "10080", APPLIED, "offsets_retention_minutes"),
    _key("offsets.topic.compression.codec", INT, "0"),
    _key("offsets.topic.num.partitions", INT, "50", APPLIED, "offsets_topic_num_partitions"),
    _key("offsets.topic.replication.factor", SHORT, "3", APPLIED,
         "offsets_topic_replication_factor"),
    _key("offsets.topic.segment.bytes", INT, "104857600", APPLIED, "offsets_topic_segment_bytes"),
    _key("principal.builder.class", CLASS, "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder"),
    _key("process.roles", LIST, None),
    _key("producer.id.expiration.ms", INT, "86400000", APPLIED, "producer_id_expiration_ms"),
    _key("producer.purgatory.purge.interval.requests", INT, "1000"),
    _key("queued.max.request.bytes", LONG, "-1", APPLIED, "queued_max_request_bytes"),
    _key("queued.max.requests", INT, "500"),
    _key("quota.window.num", INT, "11", APPLIED, "quota_window_num"),
    _key("quota.window.size.seconds", INT, "1", APPLIED, "quota_window_size_seconds"),
    _key("remote.fetch.max.wait.ms", INT, "500"),
    _key("remote.list.offsets.request.timeout.ms", LONG, "30000"),
    _key("remote.log.index.file.cache.total.size.bytes", LONG, "1073741824"),
    _key("remote.log.manager.copier.thread.pool.size", INT, "10"),
    _key("remote.log.manager.copy.max.bytes.per.second", LONG, "9223372036854775807"),
    _key("remote.log.manager.copy.quota.window.num", INT, "11"),
    _key("remote.log.manager.copy.quota.window.size.seconds", INT, "1"),
    _key("remote.log.manager.expiration.thread.pool.size", INT, "10"),
    _key("remote.log.manager.fetch.max.bytes.per.second", LONG, "9223372036854775807"),
    _key("remote.log.manager.fetch.quota.window.num", INT, "11"),
    _key("remote.log.manager.fetch.quota.window.size.seconds", INT, "1"),
    _key("remote.log.manager.follower.thread.pool.size", INT, "2"),
    _key("remote.log.manager.task.interval.ms", LONG, "30000"),
    _key("remote.log.manager.thread.pool.size", INT, "2"),
    _key("remote.log.metadata.custom.metadata.max.bytes", INT, "128"),
    _key("remote.log.metadata.manager.class.name", STRING, "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"),
    _key("remote.log.metadata.manager.class.path", STRING, None),
    _key("remote.log.metadata.manager.impl.prefix", STRING, "rlmm.config."),
    _key("remote.log.metadata.manager.listener.name", STRING, None),
    _key("remote.log.reader.max.pending.tasks", INT, "100"),
    _key("remote.log.reader.threads", INT, "10"),
    _key("remote.log.storage.manager.class.name", STRING, None),
    _key("remote.log.storage.manager.class.path", STRING, None),
    _key("remote.log.storage.manager.impl.prefix", STRING, "rsm.config."),
    _key("remote.log.storage.system.enable", BOOLEAN, "false"),
    _key("replica.fetch.backoff.ms", INT, "1000"),
    _key("replica.fetch.max.bytes", INT, "1048576"),
    _key("replica.fetch.min.bytes", INT, "1"),
    _key("replica.fetch.response.max.bytes", INT, "10485760"),
    _key("replica.fetch.wait.max.ms", INT, "500"),
    _key("replica.high.watermark.checkpoint.interval.ms", LONG, "5000"),
    _key("replica.lag.time.max.ms", LONG, "30000", APPLIED, "replica_lag_time_max_ms"),
    _key("replica.selector.class", STRING, None),
    _key("replica.socket.receive.buffer.bytes", INT, "65536"),
    _key("replica.socket.timeout.ms", INT, "30000"),
    _key("replication.quota.window.num", INT, "11"),
    _key("replication.quota.window.size.seconds", INT, "1"),
    _key("request.timeout.ms", INT, "30000"),
    _key("sasl.client.callback.handler.class", CLASS, None),
    _key("sasl.enabled.mechanisms", LIST, "GSSAPI", APPLIED, SECURITY),
    _key("sasl.jaas.config", PASSWORD, None, APPLIED, SECURITY),
    _key("sasl.kerberos.kinit.cmd", STRING, "/usr/bin/kinit"),
    _key("sasl.kerberos.min.time.before.relogin", LONG, "60000"),
    _key("sasl.kerberos.principal.to.local.rules", LIST, "DEFAULT"),
    _key("sasl.kerberos.service.name", STRING, None),
    _key("sasl.kerberos.ticket.renew.jitter", DOUBLE, "0.05"),
    _key("sasl.kerberos.ticket.renew.window.factor", DOUBLE, "0.8"),
    _key("sasl.login.callback.handler.class", CLASS, None),
    _key("sasl.login.class", CLASS, None),
    _key("sasl.login.connect.timeout.ms", INT, None),
    _key("sasl.login.read.timeout.ms", INT, None),
    _key("sasl.login.refresh.buffer.seconds", SHORT, "300"),
    _key("sasl.login.refresh.min.period.seconds", SHORT, "60"),
    _key("sasl.login.refresh.window.factor", DOUBLE, "0.8"),
    _key("sasl.login.refresh.window.jitter", DOUBLE, "0.05"),
    _key("sasl.login.retry.backoff.max.ms", LONG, "10000"),
    _key("sasl.login.retry.backoff.ms", LONG, "100"),
    _key("sasl.mechanism.controller.protocol", STRING, "GSSAPI"),
    _key("sasl.mechanism.inter.broker.protocol", STRING, "GSSAPI", APPLIED, SECURITY),
    _key("sasl.oauthbearer.allow.unverified.audience", BOOLEAN, "false"),
    _key("sasl.oauthbearer.allow.unverified.issuer", BOOLEAN, "false"),
    _key("sasl.oauthbearer.assertion.algorithm", STRING, "RS256"),
    _key("sasl.oauthbearer.assertion.claim.aud", STRING, None),
    _key("sasl.oauthbearer.assertion.claim.exp.seconds", INT, "300"),
    _key("sasl.oauthbearer.assertion.claim.iss", STRING, None),
    _key("sasl.oauthbearer.assertion.claim.jti.include", BOOLEAN, "false"),
    _key("sasl.oauthbearer.assertion.claim.nbf.seconds", INT, "60"),
    _key("sasl.oauthbearer.assertion.claim.sub", STRING, None),
    _key("sasl.oauthbearer.assertion.file", STRING, None),
    _key("sasl.oauthbearer.assertion.private.key.file", STRING, None),
    _key("sasl.oauthbearer.assertion.private.key.passphrase", PASSWORD, None),
    _key("sasl.oauthbearer.assertion.template.file", STRING, None),
    _key("sasl.oauthbearer.client.credentials.client.id", STRING, None),
    _key("sasl.oauthbearer.client.credentials.client.secret", PASSWORD, None),
    _key("sasl.oauthbearer.clock.skew.seconds", INT, "30"),
    _key("sasl.oauthbearer.expected.audience", LIST, ""),
    _key("sasl.oauthbearer.expected.issuer", STRING, None),
    _key("sasl.oauthbearer.jwks.endpoint.refresh.ms", LONG, "3600000"),
    _key("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", LONG, "10000"),
    _key("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", LONG, "100"),
    _key("sasl.oauthbearer.jwks.endpoint.url", STRING, None),
    _key("sasl.oauthbearer.jwt.retriever.class", CLASS, "org.apache.kafka.common.security.oauthbearer.DefaultJwtRetriever"),
    _key("sasl.oauthbearer.jwt.validator.class", CLASS, "org.apache.kafka.common.security.oauthbearer.DefaultJwtValidator"),
    _key("sasl.oauthbearer.scope", STRING, None),
    _key("sasl.oauthbearer.scope.claim.name", STRING, "scope"),
    _key("sasl.oauthbearer.sub.claim.name", STRING, "sub"),
    _key("sasl.oauthbearer.token.endpoint.url", STRING, None),
    _key("sasl.server.callback.handler.class", CLASS, None),
    _key("sasl.server.max.receive.size", INT, "524288"),
    _key("security.inter.broker.protocol", STRING, "PLAINTEXT"),
    _key("security.providers", STRING, None),
    _key("share.coordinator.append.linger.ms", INT, "-1"),
    _key("share.coordinator.cached.buffer.max.bytes", INT, "1048588"),
    _key("share.coordinator.load.buffer.size", INT, "5242880"),
    _key("share.coordinator.snapshot.update.records.per.snapshot", INT, "500"),
    _key("share.coordinator.state.topic.compression.codec", INT, "0"),
    _key("share.coordinator.state.topic.min.isr", SHORT, "2", APPLIED,
         "share_coordinator_state_topic_min_isr"),
    _key("share.coordinator.state.topic.num.partitions", INT, "50", APPLIED,
         "share_coordinator_state_topic_num_partitions"),
    _key("share.coordinator.state.topic.replication.factor", SHORT, "3", APPLIED,
         "share_coordinator_state_topic_replication_factor"),
    _key("share.coordinator.state.topic.segment.bytes", INT, "104857600", APPLIED,
         "share_coordinator_state_topic_segment_bytes"),
    _key("share.coordinator.threads", INT, "1"),
    _key("share.coordinator.write.timeout.ms", INT, "5000"),
    _key("share.fetch.purgatory.purge.interval.requests", INT, "1000"),
    _key("socket.connection.setup.timeout.max.ms", LONG, "30000"),
    _key("socket.connection.setup.timeout.ms", LONG, "10000"),
    _key("socket.listen.backlog.size", INT, "50"),
    _key("socket.receive.buffer.bytes", INT, "102400"),
    _key("socket.request.max.bytes", INT, "104857600", APPLIED, "socket_request_max_bytes"),
    _key("socket.send.buffer.bytes", INT, "102400"),
    _key("ssl.allow.dn.changes", BOOLEAN, "false"),
    _key("ssl.allow.san.changes", BOOLEAN, "false"),
    _key("ssl.cipher.suites", LIST, ""),
    _key("ssl.client.auth", STRING, "none", APPLIED, SECURITY),
    _key("ssl.enabled.protocols", LIST, "TLSv1.2,TLSv1.3", APPLIED, SECURITY),
    _key("ssl.endpoint.identification.algorithm", STRING, "https"),
    _key("ssl.engine.factory.class", CLASS, None),
    _key("ssl.key.password", PASSWORD, None, APPLIED, SECURITY),
    _key("ssl.keymanager.algorithm", STRING, "SunX509"),
    _key("ssl.keystore.certificate.chain", PASSWORD, None, APPLIED, SECURITY),
    _key("ssl.keystore.key", PASSWORD, None, APPLIED, SECURITY),
    _key("ssl.keystore.location", STRING, None, APPLIED, SECURITY),
    _key("ssl.keystore.password", PASSWORD, None),
    _key("ssl.keystore.type", STRING, "JKS", APPLIED, SECURITY),
    _key("ssl.principal.mapping.rules", STRING, "DEFAULT", APPLIED, SECURITY),
    _key("ssl.protocol", STRING, "TLSv1.3"),
    _key("ssl.provider", STRING, None),
    _key("ssl.secure.random.implementation", STRING, None),
    _key("ssl.trustmanager.algorithm", STRING, "PKIX"),
    _key("ssl.truststore.certificates", PASSWORD, None, APPLIED, SECURITY),
    _key("ssl.truststore.location", STRING, None, APPLIED, SECURITY),
    _key("ssl.truststore.password", PASSWORD, None),
    _key("ssl.truststore.type", STRING, "JKS", APPLIED, SECURITY),
    _key("telemetry.max.bytes", INT, "1048576"),
    _key("transaction.abort.timed.out.transaction.cleanup.interval.ms", INT, "10000", APPLIED,
         "transaction_abort_timed_out_transaction_cleanup_interval_ms"),
    _key("transaction.max.timeout.ms", INT, "900000", APPLIED,
         "transaction_max_timeout_ms"),
    _key("transaction.partition.verification.enable", BOOLEAN, "true"),
    _key("transaction.remove.expired.transaction.cleanup.interval.ms", INT, "3600000", APPLIED,
         "transaction_remove_expired_transaction_cleanup_interval_ms"),
    _key("transaction.state.log.load.buffer.size", INT, "5242880"),
    _key("transaction.state.log.min.isr", INT, "2", APPLIED, "transaction_state_log_min_isr"),
    _key("transaction.state.log.num.partitions", INT, "50", APPLIED,
         "transaction_state_log_num_partitions"),
    _key("transaction.state.log.replication.factor", SHORT, "3", APPLIED,
         "transaction_state_log_replication_factor"),
    _key("transaction.state.log.segment.bytes", INT, "104857600", APPLIED,
         "transaction_state_log_segment_bytes"),
    _key("transaction.two.phase.commit.enable", BOOLEAN, "false"),
    _key("transactional.id.expiration.ms", INT, "604800000", APPLIED,
         "transactional_id_expiration_ms"),
    _key("unclean.leader.election.enable", BOOLEAN, "false", APPLIED,
         "unclean_leader_election_enable"),

]

_OTHER_KEYS = [
    _key("super.users", STRING, None, APPLIED, "super_users", origin="authorizer"),
    _key("allow.everyone.if.no.acl.found", BOOLEAN, "false", APPLIED,
         "allow_everyone_if_no_acl_found", origin="authorizer"),
    _key("storage", STRING, None, APPLIED, "storage", origin="ours"),
    # Cluster mode ([cluster]): Kafka 4 dropped ZooKeeper; these are Kafka 3's keys.
    _key("zookeeper.connect", STRING, None, APPLIED, "zookeeper_connect", origin="ours"),
    _key("zookeeper.session.timeout.ms", INT, "18000", APPLIED,
         "zookeeper_session_timeout_ms", origin="ours"),
    _key("zookeeper.set.acl", BOOLEAN, "false", APPLIED, "zookeeper_set_acl", origin="ours"),
    # Kafka's brokers name this file with -Djava.security.auth.login.config.
    _key("zookeeper.jaas.file", STRING, None, APPLIED, "zookeeper_jaas_file", origin="ours"),
    # TLS to ZooKeeper (Kafka 3's keys), read as written by security/zookeeper_tls.py.
    _key("zookeeper.ssl.client.enable", BOOLEAN, "false", APPLIED, origin="ours"),
    _key("zookeeper.ssl.keystore.location", STRING, None, APPLIED, origin="ours"),
    _key("zookeeper.ssl.keystore.password", PASSWORD, None, APPLIED, origin="ours"),
    _key("zookeeper.ssl.keystore.type", STRING, None, APPLIED, origin="ours"),
    _key("zookeeper.ssl.truststore.location", STRING, None, APPLIED, origin="ours"),
    _key("zookeeper.ssl.truststore.password", PASSWORD, None, APPLIED, origin="ours"),
    _key("zookeeper.ssl.truststore.type", STRING, None, APPLIED, origin="ours"),
    _key("zookeeper.ssl.endpoint.identification.algorithm", STRING, "HTTPS", APPLIED,
         origin="ours"),
    _key("zookeeper.clientCnxnSocket", STRING, None, APPLIED, origin="ours"),
    # Kafka's dynamic broker config; here also static (the file's value, under a dynamic
    # one: storage/broker_configs.py): the byte rate at which a broker copies the
    # partitions it throttles (docs/cluster.md, "Throttled catch-up").
    _key("follower.replication.throttled.rate", LONG, "9223372036854775807", APPLIED,
         "follower_replication_throttled_rate", origin="ours"),
    # The same on the leader's side: the byte rate at which it serves throttled replicas.
    _key("leader.replication.throttled.rate", LONG, "9223372036854775807", APPLIED,
         "leader_replication_throttled_rate", origin="ours"),
    _key("processing.model", STRING, None, APPLIED, "processing_model", origin="ours"),
    _key("cluster.id", STRING, None, APPLIED, "cluster_id", origin="ours"),
    _key("max.in.flight.requests.per.connection", INT, None, APPLIED,
         "max_in_flight_per_connection", origin="ours"),
    _key("capture.dir", STRING, None, APPLIED, "capture_dir", origin="ours"),
    _key("metrics.listener", STRING, None, APPLIED, "metrics_listener", origin="ours"),
    _key("console.writes.enable", BOOLEAN, "false", APPLIED, "console_writes_enable",
         origin="ours"),
    _key("request.log.slow.ms", INT, None, APPLIED, "request_log_slow_ms", origin="ours"),
    # false: acks=all counts a write once every ISR member has it in page cache, without
    # an fsync first (Kafka's durability); docs/cluster.md, "Durability stays explicit".
    _key("acks.all.fsync", BOOLEAN, "true", APPLIED, "acks_all_fsync", origin="ours"),
    # Kafka's, but internal (defineInternal: not in its documentation): how long a share
    # partition recorded as initializing is left to that initialization before a
    # heartbeat starts it again; Kafka uses offsets.commit.timeout.ms if that is more.
    _key("group.share.initialize.retry.interval.ms", INT, "30000", APPLIED,
         "group_share_initialize_retry_interval_ms", origin="kafka-internal"),
]
# fmt: on

BROKER_KEYS: Mapping[str, BrokerKey] = {key.name: key for key in _KAFKA_KEYS + _OTHER_KEYS}

#: Keys that set the same value, most specific first: the first one present wins and
#: DescribeConfigs lists the others as its synonyms, as Kafka does.
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    ("log.roll.ms", "log.roll.hours"),
    ("log.dirs", "log.dir"),
)

#: Why an INERT key does nothing here, by key prefix (first match wins).
_INERT_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "controller.",
            "process.roles",
            "metadata.",
            "initial.broker.registration",
            "broker.heartbeat",
            "broker.session",
            "early.start.listeners",
            "controlled.shutdown",
            "sasl.mechanism.controller",
        ),
        "no KRaft controller quorum: the broker keeps its own metadata",
    ),
    (
        (
            "replica.",
            "num.replica",
            "replication.quota",
            "alter.log.dirs",
            "inter.broker",
            "security.inter.broker",
            "sasl.mechanism.inter.broker",
            "unclean.leader",
            "broker.rack",
            "auto.leader.rebalance",
            "leader.imbalance",
            "min.insync.replicas",
            "offsets.topic.replication",
            "transaction.state.log.replication",
            "transaction.state.log.min.isr",
            "share.coordinator.state.topic.replication",
            "share.coordinator.state.topic.min.isr",
        ),
        "the replica fetcher uses its own fixed settings (one fetch loop per leader)",
    ),
    (
        ("remote.", "log.remote.", "log.local.retention", "follower.fetch.last.tiered"),
        "no tiered storage",
    ),
    (("transaction", "add.partitions.to.txn"), "no transactions"),
    (
        ("group.share.", "share."),
        "share groups: one assignor, no bounds checked (docs/share-groups.md)",
    ),
    (("group.streams.",), "no streams groups"),
    (
        ("group.consumer.", "group.coordinator.rebalance.protocols"),
        "the classic and consumer (KIP-848) protocols are both on; KIP-848 groups have no "
        "size or interval bounds (docs/consumer-groups.md)",
    ),
    (("log.cleaner.",), "one cleaner thread whose key map is a dict (docs/compaction.md)"),
    (
        ("sasl.", "principal.builder"),
        "SASL PLAIN and SCRAM with users kept by `trio-broker users` (docs/security.md)",
    ),
    (("ssl.",), "PEM certificates and Python's TLS defaults (docs/security.md)"),
    (("delegation.token",), "no delegation tokens"),
    (("metric", "kafka.metrics"), "metrics are served on metrics.listener (Prometheus)"),
    (("compression.",), "batches are stored as the producer compressed them"),
    (
        (
            "num.network.threads",
            "background.threads",
            "num.recovery.threads",
            "group.coordinator.",
            "share.coordinator.threads",
        ),
        "one Trio event loop, no thread pools to size",
    ),
    (
        ("socket.", "log.index.", "log.preallocate", "log.segment.delete", "log.flush."),
        "the storage and socket layers use their own fixed settings",
    ),
)


def inert_reason(key: str) -> str:
    """A short reason why ``key`` has no effect here (for the warning and the docs)."""
    for prefixes, reason in _INERT_REASONS:
        if key.startswith(prefixes):
            return reason
    return "not implemented by trio-broker"


def lookup(key: str) -> BrokerKey:
    """The table row of ``key``; ConfigError naming the key (and a close match) if unknown."""
    spec = BROKER_KEYS.get(key)
    if spec is not None:
        return spec
    close = difflib.get_close_matches(key, list(BROKER_KEYS), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown config key {key!r}{hint}")


def listener_key(key: str) -> BrokerKey:
    """The row of ``listener.name.<listener>.<key>`` (or ``.<mechanism>.sasl.<...>``)."""
    rest = key[len("listener.name.") :]
    listener, _, inner = rest.partition(".")
    if listener and inner:
        if inner in BROKER_KEYS:
            return BROKER_KEYS[inner]
        # Per-mechanism SASL settings: listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config
        _mechanism, _, mechanism_key = inner.partition(".")
        if mechanism_key.startswith("sasl.") and mechanism_key in BROKER_KEYS:
            return BROKER_KEYS[mechanism_key]
    raise ConfigError(f"unknown config key {key!r}")


def parse_value(spec: BrokerKey, value: Any, key: str | None = None) -> Any:
    """A value (string from a properties file, or a TOML value) as its Kafka type.

    Kafka trims every value but a password's; booleans are true/false in any case.
    """
    name = key or spec.name
    if spec.type == BOOLEAN:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return text == "true"
    if spec.type in (INT, SHORT, LONG):
        if isinstance(value, bool | float):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if spec.type == DOUBLE:
        try:
            return float(str(value).strip())
        except ValueError:
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if isinstance(value, list | tuple) and spec.type == LIST:
        return ",".join(str(item).strip() for item in value)
    if isinstance(value, bool | int | float) or not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value if spec.type == PASSWORD else value.strip()
