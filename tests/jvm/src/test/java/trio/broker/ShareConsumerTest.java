package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.BOUND;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.createTopic;
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
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Share groups (KIP-932) with the Java {@code KafkaShareConsumer}: two members split a topic's
 * records, a record whose acquisition lock runs out is delivered again with a higher delivery
 * count, a released record comes back and a rejected one does not.
 *
 * <p>Run by tests/e2e/test_java_share_consumer.py (-Dtest=ShareConsumerTest) against a broker
 * with a short {@code group.share.record.lock.duration.ms} (-Dshare.lock.ms); the pom leaves
 * it out of the full run.
 */
@Timeout(180)
class ShareConsumerTest {
  static final long LOCK_MS = Long.parseLong(System.getProperty("share.lock.ms", "30000"));
  /** Rounds of records the two members may take until both have had some. */
  static final int ROUNDS = 5;

  static KafkaShareConsumer<byte[], byte[]> shareConsumer(String group) {
    Properties p = new Properties();
    p.putAll(plain());
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 20);
    return new KafkaShareConsumer<>(p);
  }

  static void produce(String topic, int partitions, List<String> values) {
    produce(topic, partitions, values, Map.of());
  }

  static void produce(
      String topic, int partitions, List<String> values, Map<String, Object> settings) {
    try (KafkaProducer<byte[], byte[]> producer = producer(settings)) {
      int i = 0;
      for (String value : values) {
        producer.send(new ProducerRecord<>(topic, i++ % partitions, null, bytes(value)));
      }
      producer.flush();
    }
  }

  /** Poll every consumer in turn until the condition holds (bounded). */
  static boolean pollUntil(List<KafkaShareConsumer<byte[], byte[]>> consumers,
      Map<KafkaShareConsumer<byte[], byte[]>, List<ConsumerRecord<byte[], byte[]>>> seen,
      AcknowledgeType answer, BooleanSupplier done) {
    long deadline = System.nanoTime() + BOUND.toNanos() + Duration.ofMillis(LOCK_MS).toNanos();
    while (System.nanoTime() < deadline) {
      for (KafkaShareConsumer<byte[], byte[]> consumer : consumers) {
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(100))) {
          seen.computeIfAbsent(consumer, c -> new ArrayList<>()).add(record);
          if (answer != null) {
            consumer.acknowledge(record, answer);
          }
        }
      }
      if (done.getAsBoolean()) {
        return true;
      }
    }
    return done.getAsBoolean();
  }

  /**
   * The group has its members, each with partitions, and every partition has a member; with
   * no more members than partitions, no two members share one. The describe shows what each
   * member was last told (a member learns a new assignment from its own heartbeat), so a
   * member that has not heartbeated since another joined still shows the partitions it had.
   */
  static boolean assigned(Admin admin, String group, int members, int partitions) {
    try {
      ShareGroupDescription description =
          admin.describeShareGroups(List.of(group)).describedGroups().get(group).get();
      if (description.members().size() != members) {
        return false;
      }
      Set<TopicPartition> covered = new HashSet<>();
      int held = 0;
      for (ShareMemberDescription member : description.members()) {
        if (member.assignment().topicPartitions().isEmpty()) {
          return false;
        }
        covered.addAll(member.assignment().topicPartitions());
        held += member.assignment().topicPartitions().size();
      }
      return covered.size() == partitions && (members > partitions || held == partitions);
    } catch (Exception e) {
      return false;
    }
  }

  static List<String> values(String prefix, int count) {
    List<String> out = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      out.add(prefix + i);
    }
    return out;
  }

  @Test
  void twoMembersSplitTheRecordsEachOnce() throws Exception {
    String topic = createTopic(2);
    String group = uniqueName("share");
    var seen = new HashMap<KafkaShareConsumer<byte[], byte[]>, List<ConsumerRecord<byte[], byte[]>>>();
    try (Admin admin = admin();
        KafkaShareConsumer<byte[], byte[]> a = shareConsumer(group);
        KafkaShareConsumer<byte[], byte[]> b = shareConsumer(group)) {
      a.subscribe(List.of(topic));
      b.subscribe(List.of(topic));
      List<KafkaShareConsumer<byte[], byte[]>> both = List.of(a, b);
      // Two members, two partitions: one each (the simple assignor). A share partition
      // starts at the log end when first assigned (share.auto.offset.reset=latest).
      assertTrue(pollUntil(both, seen, AcknowledgeType.ACCEPT, () -> assigned(admin, group, 2, 2)));
      // Which member gets which records is the share partitions' to decide, not a promise:
      // a fetch a member sent before it learned its new assignment may still be waiting on
      // the broker, naming both partitions, and take the first records of both. Its next
      // fetch names its own partition only, so a later round is split.
      List<String> sent = new ArrayList<>();
      Set<String> received = new HashSet<>();
      List<String> all = new ArrayList<>();
      for (int round = 0; round < ROUNDS && (!seen.containsKey(a) || !seen.containsKey(b));
          round++) {
        sent.addAll(values("r" + round + "-", 200));
        produce(topic, 2, sent.subList(sent.size() - 200, sent.size()));
        assertTrue(pollUntil(both, seen, AcknowledgeType.ACCEPT, () -> {
          all.clear();
          seen.values().forEach(rs -> rs.forEach(r -> all.add(text(r.value()))));
          received.clear();
          received.addAll(all);
          return received.size() == sent.size();
        }), "received " + received.size() + " of " + sent.size());
      }
      a.commitSync();
      b.commitSync();
      assertEquals(sent.size(), all.size(), "a record was delivered twice");
      assertEquals(new HashSet<>(sent), received);
      assertTrue(seen.getOrDefault(a, List.of()).size() > 0, "the first member got nothing");
      assertTrue(seen.getOrDefault(b, List.of()).size() > 0, "the second member got nothing");
      for (var records : seen.values()) {
        for (var record : records) {
          assertEquals(1, (int) record.deliveryCount().orElseThrow());
        }
      }
    }
  }

  @Test
  void aRecordWhoseLockRunsOutIsDeliveredAgain() throws Exception {
    String topic = createTopic(1);
    String group = uniqueName("share");
    var seen = new HashMap<KafkaShareConsumer<byte[], byte[]>, List<ConsumerRecord<byte[], byte[]>>>();
    try (Admin admin = admin();
        KafkaShareConsumer<byte[], byte[]> holder = shareConsumer(group);
        KafkaShareConsumer<byte[], byte[]> other = shareConsumer(group)) {
      holder.subscribe(List.of(topic));
      other.subscribe(List.of(topic));
      assertTrue(pollUntil(List.of(holder), seen, null, () -> assigned(admin, group, 1, 1)));
      List<String> sent = values("lock-", 5);
      // One batch, so the holder gets all five in one poll: in explicit acknowledgement
      // mode it may not poll again while holding records it has not acknowledged (the
      // producer's first send would otherwise go out alone, in a batch of its own).
      produce(topic, 1, sent, Map.of(ProducerConfig.LINGER_MS_CONFIG, 10_000));
      // The holder takes the records and never acknowledges them.
      assertTrue(pollUntil(List.of(holder), seen, null,
          () -> seen.getOrDefault(holder, List.of()).size() == sent.size()));
      long taken = System.nanoTime();
      assertTrue(pollUntil(List.of(other), seen, AcknowledgeType.ACCEPT,
          () -> seen.getOrDefault(other, List.of()).size() == sent.size()));
      long waitedMs = (System.nanoTime() - taken) / 1_000_000;
      other.commitSync();
      Set<String> again = new HashSet<>();
      for (var record : seen.get(other)) {
        again.add(text(record.value()));
        // At least the second delivery. The holder's client may have had another fetch
        // waiting on the broker when the lock ran out (it fetches ahead in the background,
        // unpolled): that fetch acquires the records again and they run out a second time.
        int count = record.deliveryCount().orElseThrow();
        assertTrue(count >= 2, text(record.value()) + " delivered " + count + " times");
      }
      assertEquals(sent.size(), seen.get(other).size(), "the other member got a record twice");
      assertEquals(new HashSet<>(sent), again);
      // Not before the lock ran out (less a margin for the clocks' granularity).
      assertTrue(waitedMs >= LOCK_MS - 1000, "redelivered after " + waitedMs + " ms");
    }
  }

  @Test
  void releasedRecordsComeBackRejectedOnesDoNot() throws Exception {
    String topic = createTopic(1);
    String group = uniqueName("share");
    var seen = new HashMap<KafkaShareConsumer<byte[], byte[]>, List<ConsumerRecord<byte[], byte[]>>>();
    try (Admin admin = admin(); KafkaShareConsumer<byte[], byte[]> c = shareConsumer(group)) {
      c.subscribe(List.of(topic));
      assertTrue(pollUntil(List.of(c), seen, null, () -> assigned(admin, group, 1, 1)));
      List<String> sent = values("ack-", 9);
      produce(topic, 1, sent);
      List<ConsumerRecord<byte[], byte[]>> log = new ArrayList<>();
      // First delivery: accept r%3==0, release r%3==1, reject r%3==2; a redelivery: accept.
      long deadline = System.nanoTime() + BOUND.toNanos();
      boolean endSeen = false;
      boolean endSent = false;
      while (!endSeen && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> record : c.poll(Duration.ofMillis(100))) {
          log.add(record);
          String value = text(record.value());
          if (value.equals("end")) {
            endSeen = true;
            c.acknowledge(record, AcknowledgeType.ACCEPT);
            continue;
          }
          int i = Integer.parseInt(value.substring(4));
          int count = record.deliveryCount().orElseThrow();
          AcknowledgeType answer = count > 1 ? AcknowledgeType.ACCEPT
              : i % 3 == 0 ? AcknowledgeType.ACCEPT
              : i % 3 == 1 ? AcknowledgeType.RELEASE : AcknowledgeType.REJECT;
          c.acknowledge(record, answer);
        }
        long redelivered = log.stream().filter(r -> r.deliveryCount().orElseThrow() > 1).count();
        if (!endSent && redelivered == 3) {
          c.commitSync();
          // Anything still available would be acquired before this later record.
          produce(topic, 1, List.of("end"));
          endSent = true;
        }
      }
      c.commitSync();
      assertTrue(endSeen, "never got the end marker: " + log.size() + " records");
      Map<String, List<Integer>> deliveries = new HashMap<>();
      for (var record : log) {
        deliveries.computeIfAbsent(text(record.value()), v -> new ArrayList<>())
            .add((int) record.deliveryCount().orElseThrow());
      }
      for (int i = 0; i < sent.size(); i++) {
        List<Integer> expected = i % 3 == 1 ? List.of(1, 2) : List.of(1);
        assertEquals(expected, deliveries.get("ack-" + i), "ack-" + i);
      }
    }
  }
}
