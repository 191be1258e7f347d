package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.BOUND;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.text;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Share-partition state across a broker restart, with the Java {@code KafkaShareConsumer}.
 *
 * <p>Two runs of one JVM each, with the broker killed (-9) and started again in between, by
 * tests/e2e/test_java_share_restart.py (-Dtest=ShareRestartTest#beforeTheRestart, then
 * #afterTheRestart; the pom leaves the class out of the full run). Before: a member takes
 * what its first poll brings, accepts half of it and leaves the JVM holding the rest (never
 * closed, so nothing is given back), writing what it saw to {@code share.state.file}. After:
 * a new member of the group gets every record but the accepted ones, once each; those held
 * before the restart come with delivery count 2, those never delivered with 1.
 */
@Timeout(180)
class ShareRestartTest {
  static final String TOPIC = System.getProperty("share.topic", "");
  static final String GROUP = System.getProperty("share.group", "");
  static final Path STATE = Path.of(System.getProperty("share.state.file", "share-state.txt"));
  static final int RECORDS = 20;

  @Test
  void beforeTheRestart() throws Exception {
    // Not closed on purpose: closing would give back what it holds.
    KafkaShareConsumer<byte[], byte[]> member = ShareConsumerTest.shareConsumer(GROUP);
    member.subscribe(List.of(TOPIC));
    var seen = new HashMap<KafkaShareConsumer<byte[], byte[]>, List<ConsumerRecord<byte[], byte[]>>>();
    try (Admin admin = admin()) {
      assertTrue(ShareConsumerTest.pollUntil(List.of(member), seen, null,
          () -> ShareConsumerTest.assigned(admin, GROUP, 1, 1)));
    }
    ShareConsumerTest.produce(TOPIC, 1, ShareConsumerTest.values("r", RECORDS));
    // The 20 records may come over several polls. In explicit acknowledgement mode every
    // record a poll brought must be acknowledged before the next poll (the consumer throws
    // otherwise): poll until the last poll brought two records, or one with another
    // accepted before it; the records of an earlier poll are accepted.
    List<ConsumerRecord<byte[], byte[]>> accepted = new ArrayList<>();
    List<ConsumerRecord<byte[], byte[]>> last = new ArrayList<>();
    long deadline = System.nanoTime() + BOUND.toNanos();
    while (!(last.size() >= 2 || (last.size() == 1 && !accepted.isEmpty()))
        && System.nanoTime() < deadline) {
      for (ConsumerRecord<byte[], byte[]> record : last) {
        member.acknowledge(record, AcknowledgeType.ACCEPT);
        accepted.add(record);
      }
      last = new ArrayList<>();
      member.poll(Duration.ofMillis(100)).forEach(last::add);
    }
    assertTrue(accepted.size() + last.size() >= 2 && !last.isEmpty(),
        "the polls brought " + (accepted.size() + last.size()) + " records");
    // Of the last poll's records, the first half is accepted too when nothing was yet.
    int acceptNow = accepted.isEmpty() ? last.size() / 2 : 0;
    List<String> lines = new ArrayList<>();
    for (ConsumerRecord<byte[], byte[]> record : accepted) {
      assertEquals(1, (int) record.deliveryCount().orElseThrow());
      lines.add("accepted " + text(record.value()));
    }
    for (int i = 0; i < last.size(); i++) {
      ConsumerRecord<byte[], byte[]> record = last.get(i);
      assertEquals(1, (int) record.deliveryCount().orElseThrow());
      boolean accept = i < acceptNow;
      if (accept) {
        member.acknowledge(record, AcknowledgeType.ACCEPT);
      }
      lines.add((accept ? "accepted " : "held ") + text(record.value()));
    }
    member.commitSync(); // the acceptances are answered, so durable
    Files.write(STATE, lines);
  }

  @Test
  void afterTheRestart() throws Exception {
    Set<String> accepted = new HashSet<>();
    Set<String> held = new HashSet<>();
    for (String line : Files.readAllLines(STATE)) {
      String[] parts = line.split(" ");
      (parts[0].equals("accepted") ? accepted : held).add(parts[1]);
    }
    Map<String, Integer> got = new HashMap<>();
    List<String> twice = new ArrayList<>();
    try (KafkaShareConsumer<byte[], byte[]> member = ShareConsumerTest.shareConsumer(GROUP)) {
      member.subscribe(List.of(TOPIC));
      int wanted = RECORDS - accepted.size();
      long deadline = System.nanoTime() + 2 * BOUND.toNanos();
      while (got.size() < wanted && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> record : member.poll(Duration.ofMillis(100))) {
          if (got.put(text(record.value()), (int) record.deliveryCount().orElseThrow()) != null) {
            twice.add(text(record.value()));
          }
          member.acknowledge(record, AcknowledgeType.ACCEPT);
        }
      }
      member.commitSync();
    }
    assertEquals(List.of(), twice, "delivered twice after the restart");
    Set<String> expected = new HashSet<>(ShareConsumerTest.values("r", RECORDS));
    expected.removeAll(accepted);
    assertEquals(expected, got.keySet(), "accepted before the restart: " + accepted);
    for (var entry : got.entrySet()) {
      int count = held.contains(entry.getKey()) ? 2 : 1;
      assertEquals(count, (int) entry.getValue(), entry.getKey());
    }
  }
}
