package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.plain;
import static trio.broker.Clients.producer;
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
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.UnsupportedAssignorException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** KIP-848 (group.protocol=consumer): server-side assignment through ConsumerGroupHeartbeat. */
@Timeout(180)
class ConsumerProtocolTest {
  static final int PARTITIONS = 6;

  static KafkaConsumer<byte[], byte[]> member(String group, String clientId, Map<String, Object> extra) {
    Properties p = new Properties();
    p.putAll(plain());
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
    p.putAll(extra);
    return new KafkaConsumer<>(p);
  }

  /** One member: polls, remembers what it read, commits after every poll. */
  static final class Member {
    final KafkaConsumer<byte[], byte[]> consumer;
    final List<String> read = new ArrayList<>();

    Member(String group, String clientId, String topic) {
      consumer = member(group, clientId, Map.of());
      consumer.subscribe(List.of(topic));
    }

    void step() {
      for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
        read.add(text(r.value()));
      }
      consumer.commitSync();
    }

    Set<Integer> owned() {
      return consumer.assignment().stream().map(TopicPartition::partition).collect(Collectors.toSet());
    }
  }

  static void produce(String topic, int from, int count) throws Exception {
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      for (int i = from; i < from + count; i++) {
        producer.send(new ProducerRecord<>(topic, i % PARTITIONS, null, bytes("r" + i))).get();
      }
    }
  }

  /** Step every member until each owns {@code each} partitions, together all of them. */
  static boolean shared(List<Member> members, int each) throws InterruptedException {
    return eventually(() -> {
      Set<Integer> all = new HashSet<>();
      boolean even = true;
      for (Member m : members) {
        m.step();
        even &= m.owned().size() == each;
        Set<Integer> owned = m.owned();
        for (int p : owned) {
          if (!all.add(p)) {
            return false; // two owners: not settled yet (and never expected)
          }
        }
      }
      return even && all.size() == PARTITIONS;
    });
  }

  static boolean readAll(List<Member> members, int total) throws InterruptedException {
    return eventually(() -> {
      members.forEach(Member::step);
      return members.stream().mapToInt(m -> m.read.size()).sum() >= total;
    });
  }

  @Test
  void membersShareMoveAndLeaveWithoutDuplicatesOrLosses() throws Exception {
    String topic = createTopic(PARTITIONS);
    String group = uniqueName("kip848");
    produce(topic, 0, 60);
    Member a = new Member(group, "member-a", topic);
    Member b = new Member(group, "member-b", topic);
    Member c = null;
    try {
      assertTrue(shared(List.of(a, b), 3), "a " + a.owned() + " b " + b.owned());
      assertTrue(readAll(List.of(a, b), 60));

      try (Admin admin = admin()) {
        ConsumerGroupDescription d =
            admin.describeConsumerGroups(List.of(group)).all().get().get(group);
        assertEquals(GroupType.CONSUMER, d.type());
        assertEquals(GroupState.STABLE, d.groupState());
        assertEquals(2, d.members().size());
        assertEquals("uniform", d.partitionAssignor());
        Set<GroupListing> listed = new HashSet<>(admin.listGroups().all().get());
        assertTrue(listed.stream().anyMatch(g -> g.groupId().equals(group)
            && g.type().equals(java.util.Optional.of(GroupType.CONSUMER))), listed.toString());
      }

      c = new Member(group, "member-c", topic);
      produce(topic, 60, 60);
      assertTrue(shared(List.of(a, b, c), 2), "a " + a.owned() + " b " + b.owned() + " c " + c.owned());
      assertTrue(readAll(List.of(a, b, c), 120));

      c.consumer.close(); // leaves the group (member epoch -1)
      List<String> fromC = c.read;
      c = null;
      produce(topic, 120, 60);
      assertTrue(shared(List.of(a, b), 3), "a " + a.owned() + " b " + b.owned());
      List<String> all = new ArrayList<>(a.read);
      all.addAll(b.read);
      all.addAll(fromC);
      assertTrue(eventually(() -> {
        a.step();
        b.step();
        return a.read.size() + b.read.size() + fromC.size() >= 180;
      }));
      all = new ArrayList<>(a.read);
      all.addAll(b.read);
      all.addAll(fromC);
      assertEquals(180, all.size(), "duplicates were read");
      assertEquals(180, new HashSet<>(all).size());

      try (Admin admin = admin()) {
        Map<TopicPartition, OffsetAndMetadata> committed =
            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        Map<Integer, Long> offsets = new HashMap<>();
        committed.forEach((tp, om) -> offsets.put(tp.partition(), om.offset()));
        for (int p = 0; p < PARTITIONS; p++) {
          assertEquals(30L, offsets.get(p), "partition " + p + ": " + offsets);
        }
      }
    } finally {
      a.consumer.close();
      b.consumer.close();
      if (c != null) {
        c.consumer.close();
      }
    }
  }

  @Test
  void sendOffsetsToTransactionWithTheMembersEpoch() throws Exception {
    String input = createTopic(1);
    String output = createTopic(1);
    TopicPartition in = new TopicPartition(input, 0);
    produce(input, 0, 1); // partition 0 of a one-partition topic (i % PARTITIONS == 0)
    try (KafkaProducer<byte[], byte[]> plain = producer(Map.of())) {
      for (int i = 1; i < 4; i++) {
        plain.send(new ProducerRecord<>(input, 0, null, bytes("r" + i))).get();
      }
    }
    String group = uniqueName("kip848-txn");
    try (KafkaConsumer<byte[], byte[]> consumer = member(group, "txn-member",
            Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"));
        KafkaProducer<byte[], byte[]> producer = TransactionTest.transactional(uniqueName("ctp"))) {
      producer.initTransactions();
      consumer.subscribe(List.of(input));
      List<ConsumerRecord<byte[], byte[]>> batch = TransactionTest.pollAtLeast(consumer, 4);
      assertTrue(consumer.groupMetadata().generationId() > 0, "member epoch in groupMetadata");
      producer.beginTransaction();
      for (ConsumerRecord<byte[], byte[]> r : batch) {
        producer.send(new ProducerRecord<>(output, bytes("out-" + text(r.value()))));
      }
      // TxnOffsetCommit carries the member id and epoch: the group checks them.
      producer.sendOffsetsToTransaction(
          Map.of(in, new OffsetAndMetadata(4)), consumer.groupMetadata());
      producer.commitTransaction();
      assertEquals(4L, TransactionTest.committedOffset(group, in));
    }
  }

  @Test
  void aSubscriptionPatternIsResolvedByTheBroker() throws Exception {
    String prefix = uniqueName("kip848re");
    try (Admin admin = admin()) {
      admin.createTopics(List.of(
          new org.apache.kafka.clients.admin.NewTopic(prefix + "-a", 2, (short) 1),
          new org.apache.kafka.clients.admin.NewTopic(prefix + "-b", 2, (short) 1),
          new org.apache.kafka.clients.admin.NewTopic("x" + prefix, 2, (short) 1))).all().get();
    }
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      for (String t : List.of(prefix + "-a", prefix + "-b", "x" + prefix)) {
        for (int i = 0; i < 4; i++) {
          producer.send(new ProducerRecord<>(t, i % 2, null, bytes(t + "/" + i))).get();
        }
      }
    }
    try (KafkaConsumer<byte[], byte[]> consumer =
        member(uniqueName("kip848-re"), "pattern-member", Map.of())) {
      // Server-side resolution (SubscribedTopicRegex): the broker matches the topics.
      consumer.subscribe(new org.apache.kafka.clients.consumer.SubscriptionPattern(prefix + "-.*"));
      List<String> read = new ArrayList<>();
      assertTrue(eventually(() -> {
        consumer.poll(Duration.ofMillis(100)).forEach(r -> read.add(text(r.value())));
        return read.size() >= 8;
      }), "read " + read);
      assertEquals(8, read.size());
      assertTrue(read.stream().allMatch(v -> v.startsWith(prefix + "-")), read.toString());
    }
  }

  @Test
  void anUnknownServerAssignorIsRefused() throws Exception {
    String topic = createTopic(1);
    try (KafkaConsumer<byte[], byte[]> consumer =
        member(uniqueName("kip848-bad"), "bad-assignor",
            Map.of(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, "no-such-assignor"))) {
      consumer.subscribe(List.of(topic));
      UnsupportedAssignorException e = assertThrows(UnsupportedAssignorException.class, () -> {
        long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (System.nanoTime() < deadline) {
          consumer.poll(Duration.ofMillis(100));
        }
      });
      assertTrue(e.getMessage().contains("no-such-assignor"), e.getMessage());
    }
  }
}
