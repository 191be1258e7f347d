package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.text;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.config.ConfigResource;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * A {@code KafkaShareConsumer} goes on across a kill -9 of its group's coordinator, without
 * a rejoin: the new coordinator has the member, its epoch and its assignment from the group's
 * records in {@code __consumer_offsets} (groups/share_records.py).
 *
 * <p>Run alone by tests/cluster/test_java_share_coordinator_kill.py (the pom leaves it out of
 * the full run), which makes the topic (one partition) and picks the group so that its
 * coordinator ({@code -Dshare.coordinator}) leads neither the partition nor the share state
 * of the group's share partition: the kill takes the membership alone. -Dcluster.pids maps
 * each broker id to its process id.
 *
 * <p>Whether the member rejoined is told by the group epoch: a second member joins after the
 * kill, which makes one new epoch, and the first moves to it by its next heartbeat. A first
 * member that the new coordinator did not know (UNKNOWN_MEMBER_ID) would have joined again
 * with epoch 0, which makes another: the group would end two epochs on, not one.
 */
@Timeout(300)
class ShareCoordinatorKillTest {
  static final String TOPIC = System.getProperty("share.topic", "");
  static final String GROUP = System.getProperty("share.group", "");
  static final int COORDINATOR = Integer.parseInt(System.getProperty("share.coordinator", "-1"));
  static final int BEFORE = 10;
  static final int AFTER = 10;
  /** Every wait of this test: the cluster moves the coordinator after a ZooKeeper session. */
  static final Duration WAIT = Duration.ofSeconds(120);

  /** What one member saw: every value, and those it saw twice. */
  static final class Member {
    final KafkaShareConsumer<byte[], byte[]> consumer = ShareConsumerTest.shareConsumer(GROUP);
    final Set<String> seen = new HashSet<>();

    Member() {
      consumer.subscribe(List.of(TOPIC));
    }

    /** One poll; every record it brought accepted (sent with the next poll). */
    void step() {
      for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(100))) {
        seen.add(text(record.value()));
        consumer.acknowledge(record, AcknowledgeType.ACCEPT);
      }
    }
  }

  static ShareGroupDescription describe(Admin admin) throws Exception {
    return admin.describeShareGroups(List.of(GROUP)).describedGroups().get(GROUP).get();
  }

  /** Step the members until the condition holds or {@link #WAIT} passed. */
  static boolean stepUntil(List<Member> members, BooleanSupplier done) {
    long deadline = System.nanoTime() + WAIT.toNanos();
    while (System.nanoTime() < deadline) {
      members.forEach(Member::step);
      if (done.getAsBoolean()) {
        return true;
      }
    }
    return false;
  }

  static Set<String> seenBy(List<Member> members) {
    Set<String> all = new HashSet<>();
    members.forEach(m -> all.addAll(m.seen));
    return all;
  }

  @Test
  void theMemberKeepsItsEpochAcrossItsCoordinatorsKill() throws Exception {
    Map<Integer, Long> pids = ConsumerProtocolClusterTest.pids();
    try (Admin admin = Clients.admin()) {
      // The records produced before the member joins are the group's.
      ConfigResource group = new ConfigResource(ConfigResource.Type.GROUP, GROUP);
      AlterConfigOp earliest = new AlterConfigOp(
          new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET);
      admin.incrementalAlterConfigs(Map.of(group, List.of(earliest))).all().get();
      ShareConsumerTest.produce(TOPIC, 1, ShareConsumerTest.values("r", BEFORE));

      Member first = new Member();
      List<Member> one = List.of(first);
      assertTrue(stepUntil(one, () -> first.seen.size() == BEFORE), "before: " + first.seen);
      first.consumer.commitSync(); // the acceptances answered
      ShareGroupDescription before = describe(admin);
      assertEquals(COORDINATOR, before.coordinator().id(), before.toString());
      assertEquals(1, before.members().size(), before.toString());
      ShareMemberDescription member = before.members().iterator().next();
      int epoch = before.groupEpoch();
      assertEquals(epoch, member.memberEpoch(), before.toString());

      ProcessHandle coordinator = ProcessHandle.of(pids.get(COORDINATOR)).orElseThrow();
      // SIGKILL. Not waited for: the broker is pytest's child, a zombie until pytest reaps it.
      assertTrue(coordinator.destroyForcibly(), "kill -9 of broker " + COORDINATOR);

      // The first member goes on (it finds the new coordinator itself); a second joins.
      Member second = new Member();
      List<Member> both = List.of(first, second);
      assertTrue(stepUntil(both, () -> {
        try {
          ShareGroupDescription now = describe(admin);
          return now.coordinator().id() != COORDINATOR && now.members().size() == 2
              && now.members().stream().allMatch(d -> d.memberEpoch() == now.groupEpoch());
        } catch (Exception e) {
          return false;
        }
      }), "the two members never settled at the new coordinator");
      ShareGroupDescription after = describe(admin);
      assertNotEquals(COORDINATOR, after.coordinator().id());
      Set<String> ids = new HashSet<>();
      after.members().forEach(d -> ids.add(d.consumerId()));
      assertTrue(ids.contains(member.consumerId()), after.toString());
      // One new epoch (the second member's join): the first did not join again.
      assertEquals(epoch + 1, after.groupEpoch(), "before " + before + ", after " + after);

      ShareConsumerTest.produce(TOPIC, 1, ShareConsumerTest.values("s", AFTER));
      Set<String> expected = new HashSet<>(ShareConsumerTest.values("r", BEFORE));
      expected.addAll(ShareConsumerTest.values("s", AFTER));
      assertTrue(stepUntil(both, () -> seenBy(both).containsAll(expected)),
          "after: " + seenBy(both));
      for (Member m : both) {
        m.consumer.close();
      }
    }
  }
}
