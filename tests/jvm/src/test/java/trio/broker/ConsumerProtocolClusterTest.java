package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * KIP-848 (group.protocol=consumer) in a three-broker cluster whose group coordinator is
 * killed with -9 while the members run.
 *
 * <p>Run alone by tests/cluster/test_java_consumer_protocol_cluster.py (the pom leaves it out of
 * the full run): -Dbootstrap.cluster names the brokers, -Dcluster.pids maps each broker id to
 * its process id ("1:pid,2:pid,3:pid"), so that the test kills the coordinator it finds.
 */
@Timeout(180)
class ConsumerProtocolClusterTest {
  static final int PARTITIONS = 6;
  static final int BEFORE = 60;
  static final int AFTER = 60;

  static Map<Integer, Long> pids() {
    Map<Integer, Long> pids = new HashMap<>();
    for (String pair : Clients.property("cluster.pids").split(",")) {
      String[] idPid = pair.split(":");
      pids.put(Integer.parseInt(idPid[0]), Long.parseLong(idPid[1]));
    }
    return pids;
  }

  static KafkaConsumer<byte[], byte[]> member(String group, String clientId) {
    Properties p = new Properties();
    p.putAll(ClusterTest.cluster());
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
    // The partitions' leaders move off the killed broker: learn it soon.
    p.put(ConsumerConfig.METADATA_MAX_AGE_CONFIG, 2_000);
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 60_000);
    return new KafkaConsumer<>(p);
  }

  /** A member that commits (synchronously) what every poll brought before the next poll. */
  static final class Member {
    final KafkaConsumer<byte[], byte[]> consumer;
    final List<String> read = new ArrayList<>();

    Member(String group, String clientId, String topic) {
      consumer = member(group, clientId);
      consumer.subscribe(List.of(topic));
    }

    void step() {
      boolean any = false;
      for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
        read.add(text(r.value()));
        any = true;
      }
      if (any) {
        consumer.commitSync();
      }
    }

    Set<Integer> owned() {
      return consumer.assignment().stream().map(TopicPartition::partition).collect(Collectors.toSet());
    }
  }

  static void produce(String topic, int from, int count) throws Exception {
    Map<String, Object> conf = ClusterTest.cluster();
    conf.put(ProducerConfig.ACKS_CONFIG, "all");
    conf.put(ProducerConfig.METADATA_MAX_AGE_CONFIG, 2_000);
    conf.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 90_000);
    conf.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 15_000);
    try (KafkaProducer<byte[], byte[]> producer = Clients.producer(conf)) {
      List<java.util.concurrent.Future<?>> sent = new ArrayList<>();
      for (int i = from; i < from + count; i++) {
        sent.add(producer.send(new ProducerRecord<>(topic, i % PARTITIONS, null, bytes("r" + i))));
      }
      for (java.util.concurrent.Future<?> f : sent) {
        f.get();
      }
    }
  }

  /** Every member stepped until each owns three partitions, no partition twice. */
  static boolean split(Member a, Member b) throws InterruptedException {
    return eventually(() -> {
      a.step();
      b.step();
      Set<Integer> both = new HashSet<>(a.owned());
      both.addAll(b.owned());
      return a.owned().size() == PARTITIONS / 2 && b.owned().size() == PARTITIONS / 2
          && both.size() == PARTITIONS;
    });
  }

  static boolean readAll(Member a, Member b, int total) throws InterruptedException {
    long deadline = System.nanoTime() + Duration.ofSeconds(90).toNanos();
    while (System.nanoTime() < deadline) {
      a.step();
      b.step();
      if (a.read.size() + b.read.size() >= total) {
        return true;
      }
    }
    return false;
  }

  static ConsumerGroupDescription describe(Admin admin, String group) throws Exception {
    return admin.describeConsumerGroups(List.of(group)).all().get().get(group);
  }

  @Test
  void theGroupGoesOnWithTheNewCoordinatorAfterAKill9() throws Exception {
    Map<Integer, Long> pids = pids();
    String topic = uniqueName("kip848-cluster");
    String group = uniqueName("kip848-cluster");
    try (Admin admin = Clients.admin(ClusterTest.cluster())) {
      admin.createTopics(List.of(new NewTopic(topic, PARTITIONS, (short) 3))).all().get();
      assertTrue(eventually(() -> ClusterTest.fullyReplicated(
          ClusterTest.partitions(admin, topic), PARTITIONS)), "not fully replicated");
    }
    produce(topic, 0, BEFORE);
    Member a = new Member(group, "member-a", topic);
    Member b = new Member(group, "member-b", topic);
    try (Admin admin = Clients.admin(ClusterTest.cluster())) {
      assertTrue(split(a, b), "a " + a.owned() + " b " + b.owned());
      assertTrue(readAll(a, b, BEFORE), "read " + (a.read.size() + b.read.size()));

      ConsumerGroupDescription before = describe(admin, group);
      assertEquals(GroupType.CONSUMER, before.type());
      assertEquals(GroupState.STABLE, before.groupState());
      int old = before.coordinator().id();
      Map<String, Set<TopicPartition>> membersBefore = before.members().stream().collect(
          Collectors.toMap(MemberDescription::consumerId, d -> d.assignment().topicPartitions()));
      assertEquals(2, membersBefore.size(), before.toString());

      ProcessHandle coordinator = ProcessHandle.of(pids.get(old)).orElseThrow();
      // SIGKILL. Not waited for: the broker is pytest's child, a zombie until pytest reaps it.
      assertTrue(coordinator.destroyForcibly(), "kill -9 of broker " + old);

      // More records while the members carry on; they find the new coordinator themselves.
      produce(topic, BEFORE, AFTER);
      assertTrue(readAll(a, b, BEFORE + AFTER), "read " + (a.read.size() + b.read.size()));
      List<String> all = new ArrayList<>(a.read);
      all.addAll(b.read);
      Set<String> expected = IntStream.range(0, BEFORE + AFTER).mapToObj(i -> "r" + i)
          .collect(Collectors.toSet());
      assertEquals(BEFORE + AFTER, all.size(), "a record was read twice: " + all);
      assertEquals(expected, new HashSet<>(all), "a record was lost");

      // The new coordinator restored the group from its replica: the same two members
      // with the same partitions, no rejoin.
      assertTrue(eventually(() -> {
        try {
          return describe(admin, group).coordinator().id() != old;
        } catch (Exception e) {
          return false;
        }
      }), "the coordinator did not move from " + old);
      ConsumerGroupDescription after = describe(admin, group);
      assertNotEquals(old, after.coordinator().id());
      assertEquals(GroupState.STABLE, after.groupState());
      Map<String, Set<TopicPartition>> membersAfter = after.members().stream().collect(
          Collectors.toMap(MemberDescription::consumerId, d -> d.assignment().topicPartitions()));
      assertEquals(membersBefore, membersAfter);

      Map<TopicPartition, OffsetAndMetadata> committed =
          admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
      Map<Integer, Long> offsets = new HashMap<>();
      committed.forEach((tp, om) -> offsets.put(tp.partition(), om.offset()));
      Map<Integer, Long> ends = new HashMap<>();
      for (int p = 0; p < PARTITIONS; p++) {
        ends.put(p, (long) (BEFORE + AFTER) / PARTITIONS);
      }
      assertEquals(ends, offsets);
    } finally {
      a.consumer.close();
      b.consumer.close();
    }
  }
}
