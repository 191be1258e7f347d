package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.uniqueName;

import java.time.Duration;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** Classic consumer groups: the three assignors, rebalance callbacks, static membership. */
@Timeout(120)
class GroupTest {
  static final int PARTITIONS = 4;

  /** Records every callback the consumer makes: "revoked [..]", "assigned [..]", "lost [..]". */
  static final class Recorder implements ConsumerRebalanceListener {
    final List<String> events = new CopyOnWriteArrayList<>();
    final Set<Integer> owned = java.util.concurrent.ConcurrentHashMap.newKeySet();

    static String partitions(Collection<TopicPartition> tps) {
      return tps.stream().map(TopicPartition::partition).sorted().toList().toString();
    }

    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> tps) {
      events.add("revoked " + partitions(tps));
      tps.forEach(tp -> owned.remove(tp.partition()));
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> tps) {
      events.add("assigned " + partitions(tps));
      tps.forEach(tp -> owned.add(tp.partition()));
    }

    @Override
    public void onPartitionsLost(Collection<TopicPartition> tps) {
      events.add("lost " + partitions(tps));
      tps.forEach(tp -> owned.remove(tp.partition()));
    }
  }

  static Set<Integer> partitionsOf(KafkaConsumer<?, ?> consumer) {
    return consumer.assignment().stream().map(TopicPartition::partition).collect(Collectors.toSet());
  }

  /** Poll both consumers until each owns {@code each} partitions and together all of them. */
  static boolean balanced(KafkaConsumer<?, ?> a, KafkaConsumer<?, ?> b, int each)
      throws InterruptedException {
    return eventually(() -> {
      a.poll(Duration.ofMillis(50));
      b.poll(Duration.ofMillis(50));
      Set<Integer> all = new HashSet<>(partitionsOf(a));
      all.addAll(partitionsOf(b));
      return partitionsOf(a).size() == each && partitionsOf(b).size() == each
          && all.size() == 2 * each;
    });
  }

  static ConsumerGroupDescription describe(String group) throws Exception {
    try (Admin admin = admin()) {
      return admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"range", "roundrobin", "cooperative-sticky"})
  void twoMembersShareThePartitionsAndTheListenersSeeIt(String assignor) throws Exception {
    String topic = createTopic(PARTITIONS);
    String group = uniqueName("java-" + assignor);
    Class<?> strategy = switch (assignor) {
      case "range" -> RangeAssignor.class;
      case "roundrobin" -> RoundRobinAssignor.class;
      default -> CooperativeStickyAssignor.class;
    };
    Map<String, Object> conf = Map.of(
        ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, strategy.getName());
    Recorder first = new Recorder();
    Recorder second = new Recorder();
    try (KafkaConsumer<byte[], byte[]> a = consumer(group, conf);
        KafkaConsumer<byte[], byte[]> b = consumer(group, conf)) {
      a.subscribe(List.of(topic), first);
      assertTrue(eventually(() -> {
        a.poll(Duration.ofMillis(50));
        return partitionsOf(a).size() == PARTITIONS;
      }), "the first member never got every partition: " + first.events);
      assertEquals(List.of("assigned [0, 1, 2, 3]"), first.events);
      b.subscribe(List.of(topic), second);
      assertTrue(balanced(a, b, PARTITIONS / 2), first.events + " / " + second.events);
      assertEquals(first.owned, partitionsOf(a), "callbacks agree with assignment()");
      assertEquals(second.owned, partitionsOf(b));
      String aGot = Recorder.partitions(a.assignment());
      String bGot = Recorder.partitions(b.assignment());
      if (assignor.equals("cooperative-sticky")) {
        // Incremental: only the moved partitions are revoked, nothing is revoked from b.
        Set<Integer> moved = partitionsOf(b);
        assertEquals("revoked " + moved.stream().sorted().toList(), first.events.get(1), first.events.toString());
        assertTrue(second.events.stream().noneMatch(e -> e.startsWith("revoked [0") || e.startsWith("revoked [1")
            || e.startsWith("revoked [2") || e.startsWith("revoked [3")), second.events.toString());
        assertTrue(second.events.contains("assigned " + bGot), second.events.toString());
      } else {
        // Eager: the first member gives up everything, then both are assigned afresh.
        assertEquals(List.of("assigned [0, 1, 2, 3]", "revoked [0, 1, 2, 3]", "assigned " + aGot),
            first.events);
        assertEquals("assigned " + bGot, second.events.get(second.events.size() - 1));
        Set<String> halves = Set.of(aGot, bGot);
        assertEquals(assignor.equals("range")
            ? Set.of("[0, 1]", "[2, 3]") : Set.of("[0, 2]", "[1, 3]"), halves);
      }
      ConsumerGroupDescription description = describe(group);
      assertEquals(GroupState.STABLE, description.groupState());
      assertEquals(assignor, description.partitionAssignor());
      assertEquals(2, description.members().size());
    }
  }

  /** KIP-345: a static member restarted within the session timeout gets its partitions back
   *  without a rebalance; the other member's generation does not change. */
  @Test
  void aStaticMemberRestartsWithoutARebalance() throws Exception {
    String topic = createTopic(PARTITIONS);
    String group = uniqueName("java-static");
    Map<String, Object> staticA = Map.of(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-a",
        ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 20_000);
    Map<String, Object> staticB = Map.of(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-b",
        ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 20_000);
    Recorder bEvents = new Recorder();
    try (KafkaConsumer<byte[], byte[]> b = consumer(group, staticB)) {
      Set<Integer> aBefore;
      int generation;
      try (KafkaConsumer<byte[], byte[]> a = consumer(group, staticA)) {
        a.subscribe(List.of(topic));
        b.subscribe(List.of(topic), bEvents);
        assertTrue(balanced(a, b, PARTITIONS / 2));
        aBefore = partitionsOf(a);
        generation = b.groupMetadata().generationId();
        Set<String> instances = describe(group).members().stream()
            .map(member -> member.groupInstanceId().orElse("?")).collect(Collectors.toSet());
        assertEquals(Set.of("instance-a", "instance-b"), instances);
      } // close: a static member does not leave the group
      int eventsBefore = bEvents.events.size();
      ConsumerGroupDescription whileAway = describe(group);
      assertEquals(2, whileAway.members().size(), "the static member stayed in the group");
      try (KafkaConsumer<byte[], byte[]> a = consumer(group, staticA)) {
        a.subscribe(List.of(topic));
        assertTrue(eventually(() -> {
          a.poll(Duration.ofMillis(50));
          b.poll(Duration.ofMillis(50));
          return !a.assignment().isEmpty();
        }));
        assertEquals(aBefore, partitionsOf(a), "the same partitions, from the stored assignment");
        for (int i = 0; i < 10; i++) { // b keeps polling: heartbeats would report a rebalance
          b.poll(Duration.ofMillis(100));
          a.poll(Duration.ofMillis(100));
        }
        assertEquals(generation, b.groupMetadata().generationId(), "no new generation");
        assertEquals(eventsBefore, bEvents.events.size(), "b saw no rebalance: " + bEvents.events);
        assertEquals(GroupState.STABLE, describe(group).groupState());
        MemberDescription aMember = describe(group).members().stream()
            .filter(member -> member.groupInstanceId().orElse("").equals("instance-a"))
            .findFirst().orElseThrow();
        assertEquals(aBefore, aMember.assignment().topicPartitions().stream()
            .map(TopicPartition::partition).collect(Collectors.toSet()));
      }
    }
  }
}
