package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.readAll;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.Future;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.ElectionNotNeededException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * A healthy three-broker cluster (trio-broker cluster up: ZooKeeper, replication factor 3,
 * min.insync.replicas 2), reached through -Dbootstrap.cluster.
 */
@Timeout(120)
class ClusterTest {
  static final int BROKERS = 3;
  static final int PARTITIONS = 3;
  static final int RECORDS = 300;
  static final long ACKS_ALL_BOUND_MS = 8_000;

  /** Client settings pointing at the cluster instead of the single broker. */
  static Map<String, Object> cluster() {
    Map<String, Object> conf = new HashMap<>();
    conf.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, Clients.property("bootstrap.cluster"));
    return conf;
  }

  /**
   * Every partition's leader, replicas and ISR, or an empty map while the topic is unknown.
   * One partition a response: the Admin pages through DescribeTopicPartitions by cursor.
   */
  static Map<Integer, TopicPartitionInfo> partitions(Admin admin, String topic) {
    try {
      TopicDescription description = admin.describeTopics(List.of(topic),
          new DescribeTopicsOptions().partitionSizeLimitPerResponse(1)).allTopicNames().get().get(topic);
      return description.partitions().stream()
          .collect(Collectors.toMap(TopicPartitionInfo::partition, p -> p));
    } catch (Exception e) {
      return Map.of();
    }
  }

  static boolean fullyReplicated(Map<Integer, TopicPartitionInfo> partitions, int count) {
    return partitions.size() == count
        && partitions.values().stream().allMatch(p -> p.leader() != null
            && p.replicas().size() == BROKERS && p.isr().size() == BROKERS);
  }

  static String replicatedTopic(Admin admin) throws Exception {
    String topic = uniqueName("java-cluster");
    admin.createTopics(List.of(new NewTopic(topic, PARTITIONS, (short) BROKERS))).all().get();
    assertTrue(eventually(() -> fullyReplicated(partitions(admin, topic), PARTITIONS)),
        () -> "not fully replicated: " + partitions(admin, topic));
    return topic;
  }

  @Test
  void describeClusterListsThreeBrokersAndAController() throws Exception {
    try (Admin admin = Clients.admin(cluster())) {
      DescribeClusterResult described = admin.describeCluster();
      Set<Integer> ids = described.nodes().get().stream().map(Node::id).collect(Collectors.toSet());
      assertEquals(Set.of(1, 2, 3), ids);
      Node controller = described.controller().get();
      assertNotNull(controller);
      assertTrue(ids.contains(controller.id()), "controller " + controller);
      String clusterId = described.clusterId().get();
      assertTrue(clusterId != null && !clusterId.isEmpty());
      // Every broker answers for the same cluster.
      for (Node node : described.nodes().get()) {
        Map<String, Object> one = new HashMap<>();
        one.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, node.host() + ":" + node.port());
        try (Admin single = Clients.admin(one)) {
          assertEquals(clusterId, single.describeCluster().clusterId().get(), node.toString());
          assertEquals(ids, single.describeCluster().nodes().get().stream()
              .map(Node::id).collect(Collectors.toSet()), node.toString());
        }
      }
    }
  }

  @Test
  void aReplicationFactorThreeTopicHasThreeInSyncReplicasAndALeader() throws Exception {
    try (Admin admin = Clients.admin(cluster())) {
      String topic = replicatedTopic(admin);
      Set<Integer> leaders = new HashSet<>();
      for (TopicPartitionInfo p : partitions(admin, topic).values()) {
        Set<Integer> replicas = p.replicas().stream().map(Node::id).collect(Collectors.toSet());
        assertEquals(Set.of(1, 2, 3), replicas, p.toString());
        assertEquals(replicas, p.isr().stream().map(Node::id).collect(Collectors.toSet()));
        // Healthy cluster: every partition is led by its preferred (first) replica.
        assertEquals(p.replicas().get(0).id(), p.leader().id(), p.toString());
        leaders.add(p.leader().id());
      }
      // The assignment rotates the first replica, so three partitions have three leaders.
      assertEquals(Set.of(1, 2, 3), leaders);
    }
  }

  @Test
  void anIdempotentAcksAllProducerAndAGroupRoundTrip() throws Exception {
    String topic;
    try (Admin admin = Clients.admin(cluster())) {
      topic = replicatedTopic(admin);
    }
    Map<String, Object> producerConf = cluster();
    producerConf.put(ProducerConfig.ACKS_CONFIG, "all");
    producerConf.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    producerConf.put(ProducerConfig.LINGER_MS_CONFIG, 5);
    long started = System.nanoTime();
    List<Future<RecordMetadata>> sent = new ArrayList<>();
    try (KafkaProducer<byte[], byte[]> producer = Clients.producer(producerConf)) {
      for (int i = 0; i < RECORDS; i++) {
        sent.add(producer.send(new ProducerRecord<>(topic, bytes("k" + i), bytes("v" + i))));
      }
      producer.flush();
    }
    Map<Integer, Long> perPartition = new HashMap<>();
    for (Future<RecordMetadata> future : sent) {
      RecordMetadata meta = future.get();
      assertTrue(meta.offset() >= 0, meta.toString());
      perPartition.merge(meta.partition(), 1L, Long::sum);
    }
    assertEquals(PARTITIONS, perPartition.size(), "keys hash to every partition");
    // Under a second when the followers fetch at once; a follower that sat idle until the
    // leader dropped it from the ISR (replica.lag.time.max.ms, 10 s in cluster up) took 10 s.
    long producedMs = (System.nanoTime() - started) / 1_000_000;
    assertTrue(producedMs < ACKS_ALL_BOUND_MS, "acks=all took " + producedMs + " ms");

    String group = uniqueName("java-cluster-group");
    try (KafkaConsumer<byte[], byte[]> consumer = Clients.consumer(group, cluster())) {
      consumer.subscribe(List.of(topic));
      List<ConsumerRecord<byte[], byte[]>> got = readAll(consumer, RECORDS);
      Set<String> expected = IntStream.range(0, RECORDS).mapToObj(i -> "v" + i)
          .collect(Collectors.toSet());
      List<String> values = got.stream().map(r -> text(r.value())).toList();
      assertEquals(RECORDS, values.size(), "read " + values.size());
      assertEquals(expected, new HashSet<>(values), "lost or foreign records");
      for (ConsumerRecord<byte[], byte[]> r : got) {
        assertEquals("v" + text(r.key()).substring(1), text(r.value()));
      }
      consumer.commitSync();
      // The committed offsets are each partition's log end: all acknowledged records.
      Set<TopicPartition> assigned = consumer.assignment();
      assertEquals(PARTITIONS, assigned.size());
      Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(assigned);
      Map<TopicPartition, Long> ends = consumer.endOffsets(assigned);
      for (TopicPartition tp : assigned) {
        assertEquals(perPartition.get(tp.partition()), committed.get(tp).offset(), tp.toString());
        assertEquals(ends.get(tp), committed.get(tp).offset(), tp.toString());
      }
    }
    // The commits made the offsets topic: described as internal, paged 7 partitions at a time.
    try (Admin admin = Clients.admin(cluster())) {
      TopicDescription offsets = admin.describeTopics(List.of("__consumer_offsets"),
          new DescribeTopicsOptions().partitionSizeLimitPerResponse(7))
          .allTopicNames().get().get("__consumer_offsets");
      assertTrue(offsets.isInternal());
      assertTrue(offsets.partitions().size() > 7, offsets.toString());
      assertEquals(IntStream.range(0, offsets.partitions().size()).boxed().toList(),
          offsets.partitions().stream().map(TopicPartitionInfo::partition).toList());
    }
  }

  /**
   * AlterPartitionReassignments, ListPartitionReassignments and ElectLeaders through the Java
   * admin (each sent to the controller): the preferred leader already leads (election not
   * needed); the replicas are put in another order (no broker joins or leaves, so nothing
   * is listed as moving); a preferred election then hands leadership to the new first one.
   */
  @Test
  void reorderedReplicasAndAPreferredElection() throws Exception {
    try (Admin admin = Clients.admin(cluster())) {
      String topic = replicatedTopic(admin);
      TopicPartition tp = new TopicPartition(topic, 0);
      List<Integer> replicas = partitions(admin, topic).get(0).replicas().stream()
          .map(Node::id).toList();
      assertTrue(eventually(() -> partitions(admin, topic).get(0).leader().id() == replicas.get(0)),
          "the preferred replica leads a new topic");
      Optional<Throwable> first =
          admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions().get().get(tp);
      assertTrue(first.isPresent() && first.get() instanceof ElectionNotNeededException,
          () -> "expected ElectionNotNeededException, got " + first);

      List<Integer> rotated = List.of(replicas.get(1), replicas.get(2), replicas.get(0));
      admin.alterPartitionReassignments(
          Map.of(tp, Optional.of(new NewPartitionReassignment(rotated)))).all().get();
      assertEquals(Map.of(), admin.listPartitionReassignments().reassignments().get());
      assertTrue(eventually(() -> partitions(admin, topic).get(0).replicas().stream()
          .map(Node::id).toList().equals(rotated)), () -> "replicas " + partitions(admin, topic));

      Optional<Throwable> elected =
          admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions().get().get(tp);
      assertTrue(elected.isEmpty(), () -> "election failed: " + elected);
      assertTrue(eventually(() -> partitions(admin, topic).get(0).leader().id() == rotated.get(0)),
          () -> "not led by " + rotated.get(0) + ": " + partitions(admin, topic));
    }
  }
}
