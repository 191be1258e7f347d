package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.property;
import static trio.broker.Clients.text;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * One consumer group of three clients: this Java consumer, a kafka-python consumer and a
 * librdkafka (confluent-kafka) consumer. test_java_client.py starts the Python members
 * (client ids mixed.clients) on mixed.topic before Maven runs, with mixed.per.partition
 * records "P-I" in each partition and no commits; the Java member joins last.
 */
@Timeout(90)
class MixedGroupTest {
  @Test
  void javaPythonAndLibrdkafkaShareTheTopic() throws Exception {
    String topic = property("mixed.topic");
    String group = property("mixed.group");
    int perPartition = Integer.parseInt(property("mixed.per.partition"));
    Set<String> others = Set.of(property("mixed.clients").split(","));
    AtomicReference<ConsumerGroupDescription> last = new AtomicReference<>();
    Map<String, Object> conf = Map.of(
        CommonClientConfigs.CLIENT_ID_CONFIG, "java-member",
        // The one assignor all three clients implement.
        ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, RangeAssignor.class.getName());
    List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(group, conf);
        Admin admin = admin()) {
      consumer.subscribe(List.of(topic));
      boolean shared = eventually(() -> {
        consumer.poll(Duration.ofMillis(100)).forEach(got::add);
        try {
          ConsumerGroupDescription d =
              admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
          last.set(d);
          return d.groupState() == GroupState.STABLE && d.members().size() == 3
              && d.members().stream().allMatch(m -> !m.assignment().topicPartitions().isEmpty())
              && !consumer.assignment().isEmpty();
        } catch (Exception e) {
          throw new RuntimeException(e);
        }
      });
      assertTrue(shared, "the group never settled with three members: " + last.get());
      ConsumerGroupDescription group3 = last.get();
      assertEquals("range", group3.partitionAssignor());
      Set<String> clients = new HashSet<>();
      Set<TopicPartition> union = new HashSet<>();
      int total = 0;
      Set<TopicPartition> mine = null;
      for (MemberDescription m : group3.members()) {
        clients.add(m.clientId());
        union.addAll(m.assignment().topicPartitions());
        total += m.assignment().topicPartitions().size();
        assertEquals(2, m.assignment().topicPartitions().size(), m.toString());
        if (m.clientId().equals("java-member")) {
          mine = m.assignment().topicPartitions();
        }
      }
      Set<String> expectedClients = new HashSet<>(others);
      expectedClients.add("java-member");
      assertEquals(expectedClients, clients);
      assertEquals(6, union.size(), "every partition assigned");
      assertEquals(6, total, "no partition twice");
      assertEquals(mine, consumer.assignment());

      // This member reads everything in its partitions (nobody committed).
      long deadline = System.nanoTime() + Clients.BOUND.toNanos();
      while (countIn(got, mine) < 2 * perPartition && System.nanoTime() < deadline) {
        consumer.poll(Duration.ofMillis(100)).forEach(got::add);
      }
      Map<Integer, List<String>> byPartition = new HashMap<>();
      for (ConsumerRecord<byte[], byte[]> r : got) {
        if (mine.contains(new TopicPartition(r.topic(), r.partition()))) {
          byPartition.computeIfAbsent(r.partition(), k -> new ArrayList<>()).add(text(r.value()));
        }
      }
      for (TopicPartition tp : mine) {
        List<String> want = new ArrayList<>();
        for (int i = 0; i < perPartition; i++) {
          want.add(tp.partition() + "-" + i);
        }
        List<String> have = byPartition.getOrDefault(tp.partition(), List.of());
        // A record read before the last rebalance may come again; order within a partition holds.
        assertEquals(want, have.subList(Math.max(0, have.size() - perPartition), have.size()));
      }
    }
  }

  static long countIn(List<ConsumerRecord<byte[], byte[]>> records, Set<TopicPartition> tps) {
    return records.stream().filter(r -> tps.contains(new TopicPartition(r.topic(), r.partition())))
        .map(r -> r.partition() + ":" + r.offset()).distinct().count();
  }
}
