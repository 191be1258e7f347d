package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.producer;
import static trio.broker.Clients.readAll;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.io.File;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.stream.IntStream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.CreatePartitionsOptions;
import org.apache.kafka.clients.admin.DescribeReplicaLogDirsResult.ReplicaLogDirInfo;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.ListConfigResourcesOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.GroupIdNotFoundException;
import org.apache.kafka.common.errors.GroupNotEmptyException;
import org.apache.kafka.common.errors.GroupSubscribedToTopicException;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.InvalidPartitionsException;
import org.apache.kafka.common.errors.InvalidRequestException;
import org.apache.kafka.common.errors.OffsetOutOfRangeException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownMemberIdException;
import org.apache.kafka.common.errors.UnknownTopicIdException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The Admin client: topics, records, configs and consumer groups. */
@Timeout(90)
class AdminTest {
  static Throwable cause(Future<?> future) {
    ExecutionException e = assertThrows(ExecutionException.class, future::get);
    return e.getCause();
  }

  static void produce(String topic, int partition, int count) throws Exception {
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      for (int i = 0; i < count; i++) {
        producer.send(new ProducerRecord<>(topic, partition, null, bytes(partition + "-" + i)));
      }
      producer.flush();
    }
  }

  @Test
  void createsAndDeletesTopics() throws Exception {
    String topic = uniqueName("java-admin");
    try (Admin admin = admin()) {
      NewTopic spec = new NewTopic(topic, 3, (short) 1).configs(Map.of("retention.ms", "3600000"));
      var created = admin.createTopics(List.of(spec));
      created.all().get();
      assertEquals(3, created.numPartitions(topic).get());
      assertEquals(Set.of(topic), admin.describeTopics(List.of(topic)).allTopicNames().get().keySet());
      assertInstanceOf(TopicExistsException.class,
          cause(admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all()));
      assertInstanceOf(InvalidPartitionsException.class, cause(admin.createTopics(
          List.of(new NewTopic(uniqueName("java-zero"), 0, (short) 1))).all()));
      assertTrue(admin.listTopics().names().get().contains(topic));
      // By topic id (Metadata with ids): the same topic; an unknown id is refused.
      Uuid id = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).topicId();
      TopicDescription byId =
          admin.describeTopics(TopicCollection.ofTopicIds(List.of(id))).allTopicIds().get().get(id);
      assertEquals(topic, byId.name());
      assertEquals(3, byId.partitions().size());
      assertInstanceOf(UnknownTopicIdException.class, cause(
          admin.describeTopics(TopicCollection.ofTopicIds(List.of(Uuid.randomUuid()))).allTopicIds()));
      admin.deleteTopics(List.of(topic)).all().get();
      assertFalse(admin.listTopics().names().get().contains(topic));
      assertInstanceOf(UnknownTopicOrPartitionException.class,
          cause(admin.describeTopics(List.of(topic)).allTopicNames()));
      assertInstanceOf(UnknownTopicOrPartitionException.class,
          cause(admin.deleteTopics(List.of(topic)).all()));
    }
  }

  @Test
  void deleteRecordsMovesTheLogStartOffset() throws Exception {
    String topic = createTopic(1);
    TopicPartition tp = new TopicPartition(topic, 0);
    produce(topic, 0, 10);
    try (Admin admin = admin()) {
      DeletedRecords deleted =
          admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(4))).lowWatermarks().get(tp).get();
      assertEquals(4, deleted.lowWatermark());
      assertEquals(4, admin.listOffsets(Map.of(tp, OffsetSpec.earliest())).partitionResult(tp).get().offset());
      assertEquals(10, admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get().offset());
      assertInstanceOf(OffsetOutOfRangeException.class, cause(
          admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(11))).lowWatermarks().get(tp)));
    }
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(null)) {
      consumer.assign(List.of(tp));
      consumer.seekToBeginning(List.of(tp));
      var got = readAll(consumer, 6);
      assertEquals(List.of(4L, 5L, 6L, 7L, 8L, 9L), got.stream().map(r -> r.offset()).toList());
    }
  }

  static ConfigEntry entry(Admin admin, ConfigResource resource, String name) throws Exception {
    Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
    return config.get(name);
  }

  @Test
  void describesAndAltersTopicConfigs() throws Exception {
    String topic = createTopic(1, Map.of("retention.ms", "3600000"));
    ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
    try (Admin admin = admin()) {
      ConfigEntry retention = entry(admin, resource, "retention.ms");
      assertEquals("3600000", retention.value());
      assertEquals(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, retention.source());
      assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG,
          entry(admin, resource, "max.message.bytes").source());

      Collection<AlterConfigOp> ops = List.of(
          new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
          new AlterConfigOp(new ConfigEntry("max.message.bytes", "50000"), AlterConfigOp.OpType.SET));
      admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get();
      assertEquals("7200000", entry(admin, resource, "retention.ms").value());
      assertEquals("50000", entry(admin, resource, "max.message.bytes").value());

      admin.incrementalAlterConfigs(Map.of(resource, List.of(new AlterConfigOp(
          new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE)))).all().get();
      ConfigEntry reset = entry(admin, resource, "retention.ms");
      assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG, reset.source());
      assertEquals("50000", entry(admin, resource, "max.message.bytes").value(), "untouched");

      assertInstanceOf(InvalidConfigurationException.class, cause(admin.incrementalAlterConfigs(
          Map.of(resource, List.of(new AlterConfigOp(new ConfigEntry("retention.ms", "soon"),
              AlterConfigOp.OpType.SET)))).all()));
    }
  }

  @Test
  void describesTheBrokerConfig() throws Exception {
    try (Admin admin = admin()) {
      String nodeId = Integer.toString(admin.describeCluster().controller().get().id());
      ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, nodeId);
      Config config = admin.describeConfigs(List.of(broker)).all().get().get(broker);
      assertFalse(config.entries().isEmpty());
      ConfigEntry partitions = config.get("num.partitions");
      assertEquals("1", partitions.value());
    }
  }

  /** Dynamic broker configs (KIP-226): the cluster default ("") and this broker (its id). */
  @Test
  void altersDynamicBrokerConfigs() throws Exception {
    String topic = createTopic(1);
    ConfigResource topicResource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
    try (Admin admin = admin()) {
      String nodeId = Integer.toString(admin.describeCluster().controller().get().id());
      ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, nodeId);
      ConfigResource clusterDefault = new ConfigResource(ConfigResource.Type.BROKER, "");
      // Harmless values: the broker is shared with the other tests.
      String eightDays = "691200000";
      String halfGiB = "536870912";
      try {
        admin.incrementalAlterConfigs(Map.of(
            clusterDefault, List.of(new AlterConfigOp(
                new ConfigEntry("log.retention.ms", eightDays), AlterConfigOp.OpType.SET)),
            broker, List.of(new AlterConfigOp(
                new ConfigEntry("log.segment.bytes", halfGiB), AlterConfigOp.OpType.SET))))
            .all().get();
        ConfigEntry retention = entry(admin, broker, "log.retention.ms");
        assertEquals(eightDays, retention.value());
        assertEquals(ConfigEntry.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, retention.source());
        ConfigEntry segment = entry(admin, broker, "log.segment.bytes");
        assertEquals(halfGiB, segment.value());
        assertEquals(ConfigEntry.ConfigSource.DYNAMIC_BROKER_CONFIG, segment.source());
        assertEquals(eightDays, entry(admin, clusterDefault, "log.retention.ms").value());
        // A topic without its own setting inherits the dynamic values.
        ConfigEntry inherited = entry(admin, topicResource, "retention.ms");
        assertEquals(eightDays, inherited.value());
        assertEquals(ConfigEntry.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, inherited.source());
        assertEquals(halfGiB, entry(admin, topicResource, "segment.bytes").value());
        // Keys that are not dynamic are refused, the whole resource with them.
        assertInstanceOf(InvalidRequestException.class, cause(admin.incrementalAlterConfigs(
            Map.of(broker, List.of(new AlterConfigOp(new ConfigEntry("num.partitions", "3"),
                AlterConfigOp.OpType.SET)))).all()));
      } finally {
        admin.incrementalAlterConfigs(Map.of(
            clusterDefault, List.of(new AlterConfigOp(
                new ConfigEntry("log.retention.ms", ""), AlterConfigOp.OpType.DELETE)),
            broker, List.of(new AlterConfigOp(
                new ConfigEntry("log.segment.bytes", ""), AlterConfigOp.OpType.DELETE))))
            .all().get();
      }
      assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG,
          entry(admin, broker, "log.retention.ms").source());
      assertEquals(ConfigEntry.ConfigSource.DEFAULT_CONFIG,
          entry(admin, topicResource, "segment.bytes").source());
    }
  }

  /** list/describe groups, list/alter/delete offsets, delete the group. */
  @Test
  void administersConsumerGroups() throws Exception {
    String topic = createTopic(2);
    String group = uniqueName("java-admin-group");
    TopicPartition p0 = new TopicPartition(topic, 0);
    TopicPartition p1 = new TopicPartition(topic, 1);
    produce(topic, 0, 10);
    produce(topic, 1, 10);
    try (Admin admin = admin()) {
      try (KafkaConsumer<byte[], byte[]> consumer = consumer(group)) {
        consumer.subscribe(List.of(topic));
        assertEquals(20, readAll(consumer, 20).size());
        consumer.commitSync();
        assertTrue(eventually(() -> {
          try {
            return admin.listConsumerGroups().all().get().stream()
                .map(ConsumerGroupListing::groupId).anyMatch(group::equals);
          } catch (Exception e) {
            throw new RuntimeException(e);
          }
        }));
        ConsumerGroupDescription live =
            admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
        assertEquals(GroupState.STABLE, live.groupState());
        assertEquals("range", live.partitionAssignor());
        assertEquals(1, live.members().size());
        assertEquals(Set.of(p0, p1), live.members().iterator().next().assignment().topicPartitions());
        assertInstanceOf(GroupNotEmptyException.class,
            cause(admin.deleteConsumerGroups(List.of(group)).all()));
        // While a member is in: no offsets from outside, none deleted of a subscribed topic.
        assertInstanceOf(UnknownMemberIdException.class, cause(admin.alterConsumerGroupOffsets(
            group, Map.of(p0, new OffsetAndMetadata(1))).all()));
        assertInstanceOf(GroupSubscribedToTopicException.class,
            cause(admin.deleteConsumerGroupOffsets(group, Set.of(p0)).all()));
      } // close: the member leaves
      ConsumerGroupDescription empty =
          admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
      assertEquals(GroupState.EMPTY, empty.groupState());
      assertTrue(empty.members().isEmpty());

      Map<TopicPartition, OffsetAndMetadata> offsets =
          admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
      assertEquals(10, offsets.get(p0).offset());
      assertEquals(10, offsets.get(p1).offset());

      admin.alterConsumerGroupOffsets(group, Map.of(p0, new OffsetAndMetadata(3))).all().get();
      offsets = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
      assertEquals(3, offsets.get(p0).offset());
      assertEquals(10, offsets.get(p1).offset());

      admin.deleteConsumerGroupOffsets(group, Set.of(p1)).all().get();
      offsets = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
      assertEquals(Set.of(p0), offsets.keySet());

      try (KafkaConsumer<byte[], byte[]> resumed = consumer(group)) {
        resumed.subscribe(List.of(topic));
        var got = readAll(resumed, 17); // p0 from the altered offset 3, p1 from the start
        assertEquals(17, got.size());
        assertEquals(7, got.stream().filter(r -> r.partition() == 0).count());
        assertEquals(3, got.stream().filter(r -> r.partition() == 0).mapToLong(r -> r.offset()).min().orElse(-1));
      }

      admin.deleteConsumerGroups(List.of(group)).all().get();
      assertFalse(admin.listConsumerGroups().all().get().stream()
          .map(ConsumerGroupListing::groupId).anyMatch(group::equals));
      assertTrue(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().isEmpty());
      assertInstanceOf(GroupIdNotFoundException.class,
          cause(admin.deleteConsumerGroups(List.of(group)).all()));
      assertInstanceOf(GroupIdNotFoundException.class,
          cause(admin.describeConsumerGroups(List.of(group)).all()));
    }
  }

  /**
   * describeTopics by name with a page of 3 partitions (DescribeTopicPartitions and its
   * cursor): a 7-partition topic comes in pieces, whole and in order, beside a 2-partition
   * topic and an unknown one.
   */
  @Test
  void describeTopicsPagesThroughPartitions() throws Exception {
    String wide = createTopic(7);
    String narrow = createTopic(2);
    String missing = uniqueName("java-missing");
    try (Admin admin = admin()) {
      Node broker = admin.describeCluster().nodes().get().iterator().next();
      Map<String, KafkaFuture<TopicDescription>> described = admin.describeTopics(
          List.of(wide, narrow, missing), new DescribeTopicsOptions()
              .partitionSizeLimitPerResponse(3).includeAuthorizedOperations(true))
          .topicNameValues();
      for (var expected : Map.of(wide, 7, narrow, 2).entrySet()) {
        TopicDescription topic = described.get(expected.getKey()).get();
        assertEquals(expected.getKey(), topic.name());
        assertFalse(topic.isInternal());
        assertEquals(IntStream.range(0, expected.getValue()).boxed().toList(),
            topic.partitions().stream().map(TopicPartitionInfo::partition).toList());
        for (TopicPartitionInfo p : topic.partitions()) {
          assertEquals(broker, p.leader(), p.toString());
          assertEquals(List.of(broker), p.replicas());
          assertEquals(List.of(broker), p.isr());
          assertEquals(List.of(), p.elr());
        }
        assertTrue(topic.authorizedOperations().contains(AclOperation.DESCRIBE));
      }
      assertInstanceOf(UnknownTopicOrPartitionException.class, cause(described.get(missing)));
    }
  }

  /**
   * listConfigResources (ListConfigResources v1, KIP-1142): no types names every topic and
   * the broker (as BROKER and BROKER_LOGGER); TOPIC alone names only topics; CLIENT_METRICS
   * alone, what kafka-configs lists, is empty (no client-metrics subscriptions here).
   */
  @Test
  void listConfigResourcesNamesTopicsAndTheBroker() throws Exception {
    String topic = createTopic(1);
    try (Admin admin = admin()) {
      String broker = admin.describeCluster().nodes().get().iterator().next().idString();
      ConfigResource topicResource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
      Collection<ConfigResource> all =
          admin.listConfigResources(Set.of(), new ListConfigResourcesOptions()).all().get();
      assertTrue(all.contains(topicResource), all.toString());
      assertTrue(all.contains(new ConfigResource(ConfigResource.Type.BROKER, broker)));
      assertTrue(all.contains(new ConfigResource(ConfigResource.Type.BROKER_LOGGER, broker)));
      Collection<ConfigResource> topics = admin.listConfigResources(
          Set.of(ConfigResource.Type.TOPIC), new ListConfigResourcesOptions()).all().get();
      assertTrue(topics.contains(topicResource), topics.toString());
      assertTrue(topics.stream().allMatch(r -> r.type() == ConfigResource.Type.TOPIC));
      assertEquals(List.of(), List.copyOf(admin.listConfigResources(
          Set.of(ConfigResource.Type.CLIENT_METRICS), new ListConfigResourcesOptions())
          .all().get()));
    }
  }

  static int partitionCount(Admin admin, String topic) throws Exception {
    return admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
  }

  /** createPartitions: validateOnly changes nothing, a shrink is refused, the new partition works. */
  @Test
  void createPartitionsGrowsATopic() throws Exception {
    String topic = createTopic(2);
    try (Admin admin = admin()) {
      admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3)),
          new CreatePartitionsOptions().validateOnly(true)).all().get();
      assertEquals(2, partitionCount(admin, topic), "validateOnly changed the topic");
      admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get();
      assertEquals(3, partitionCount(admin, topic));
      assertInstanceOf(InvalidPartitionsException.class,
          cause(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(2))).all()));
      assertInstanceOf(InvalidPartitionsException.class,
          cause(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all()));
      assertInstanceOf(UnknownTopicOrPartitionException.class, cause(admin.createPartitions(
          Map.of(uniqueName("java-missing"), NewPartitions.increaseTo(2))).all()));
      assertEquals(3, partitionCount(admin, topic), "a refused request changed the topic");
    }
    produce(topic, 2, 5);
    TopicPartition added = new TopicPartition(topic, 2);
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(null)) {
      consumer.assign(List.of(added));
      consumer.seekToBeginning(List.of(added));
      var got = readAll(consumer, 5);
      assertEquals(List.of("2-0", "2-1", "2-2", "2-3", "2-4"),
          got.stream().map(r -> text(r.value())).toList());
      assertTrue(got.stream().allMatch(r -> r.partition() == 2));
    }
  }

  /** describeLogDirs and describeReplicaLogDirs: the broker's one data directory. */
  @Test
  void describeLogDirsShowsTheTopicsPartitions() throws Exception {
    String topic = createTopic(2);
    produce(topic, 0, 20);
    produce(topic, 1, 3);
    try (Admin admin = admin()) {
      int node = admin.describeCluster().nodes().get().iterator().next().id();
      Map<String, LogDirDescription> dirs =
          admin.describeLogDirs(List.of(node)).allDescriptions().get().get(node);
      assertEquals(1, dirs.size(), dirs.keySet().toString());
      String path = dirs.keySet().iterator().next();
      assertTrue(new File(path).isAbsolute() && new File(path).isDirectory(), path);
      LogDirDescription dir = dirs.get(path);
      assertNull(dir.error());
      assertTrue(dir.totalBytes().orElse(-1) > 0, "total bytes");
      assertTrue(dir.usableBytes().orElse(-1) > 0, "usable bytes");
      assertTrue(dir.usableBytes().getAsLong() <= dir.totalBytes().getAsLong());
      TopicPartition p0 = new TopicPartition(topic, 0);
      TopicPartition p1 = new TopicPartition(topic, 1);
      ReplicaInfo first = dir.replicaInfos().get(p0);
      ReplicaInfo second = dir.replicaInfos().get(p1);
      assertTrue(first != null && second != null, dir.replicaInfos().keySet().toString());
      assertTrue(second.size() > 0, "partition 1's size");
      assertTrue(first.size() > second.size(), first.size() + " <= " + second.size());
      assertEquals(0, first.offsetLag());
      assertFalse(first.isFuture());

      TopicPartitionReplica replica = new TopicPartitionReplica(topic, 0, node);
      ReplicaLogDirInfo info =
          admin.describeReplicaLogDirs(List.of(replica)).all().get().get(replica);
      assertEquals(path, info.getCurrentReplicaLogDir());
      assertEquals(0, info.getCurrentReplicaOffsetLag());
      assertNull(info.getFutureReplicaLogDir());
    }
  }
}
