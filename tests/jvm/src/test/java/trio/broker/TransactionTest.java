package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.producer;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Transactions (exactly-once): a transactional producer, read_committed and read_uncommitted
 * consumers, consume-transform-produce with the group's offsets in the transaction, fencing by
 * transactional.id, and the Admin's listTransactions / describeTransactions.
 */
@Timeout(120)
class TransactionTest {

  static KafkaProducer<byte[], byte[]> transactional(String transactionalId) {
    return producer(Map.of(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId));
  }

  /** A group-less consumer with the given isolation level. */
  static KafkaConsumer<byte[], byte[]> isolated(String isolationLevel) {
    return consumer(null, Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolationLevel));
  }

  /**
   * Every value the consumer gets from the partitions, polling until its position reaches each
   * partition's end offset (markers included) as the Admin lists it; bounded by Clients.BOUND.
   */
  static List<String> readToEnd(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> tps)
      throws Exception {
    Map<TopicPartition, Long> ends = new HashMap<>();
    try (Admin admin = admin()) {
      var latest = admin.listOffsets(
          tps.stream().collect(Collectors.toMap(tp -> tp, tp -> OffsetSpec.latest()))).all().get();
      latest.forEach((tp, info) -> ends.put(tp, info.offset()));
    }
    consumer.assign(tps);
    consumer.seekToBeginning(tps);
    List<String> values = new ArrayList<>();
    long deadline = System.nanoTime() + Clients.BOUND.toNanos();
    while (System.nanoTime() < deadline
        && !tps.stream().allMatch(tp -> consumer.position(tp) >= ends.get(tp))) {
      consumer.poll(Duration.ofMillis(200)).forEach(r -> values.add(text(r.value())));
    }
    for (TopicPartition tp : tps) {
      assertEquals(ends.get(tp), consumer.position(tp), "position of " + tp);
    }
    return values;
  }

  @Test
  void committedRecordsAreReadAndAbortedOnesOnlyReadUncommitted() throws Exception {
    String first = createTopic(1);
    String second = createTopic(1);
    try (KafkaProducer<byte[], byte[]> producer = transactional(uniqueName("txn"))) {
      producer.initTransactions();
      producer.beginTransaction();
      for (String topic : List.of(first, second)) {
        producer.send(new ProducerRecord<>(topic, bytes("committed-" + topic)));
        producer.send(new ProducerRecord<>(topic, bytes("committed-2-" + topic)));
      }
      producer.commitTransaction();
      producer.beginTransaction();
      for (String topic : List.of(first, second)) {
        producer.send(new ProducerRecord<>(topic, bytes("aborted-" + topic))).get();
      }
      producer.abortTransaction();
    }
    List<TopicPartition> tps =
        List.of(new TopicPartition(first, 0), new TopicPartition(second, 0));
    Set<String> committed = Set.of(
        "committed-" + first, "committed-2-" + first, "committed-" + second,
        "committed-2-" + second);
    try (KafkaConsumer<byte[], byte[]> consumer = isolated("read_committed")) {
      List<String> values = readToEnd(consumer, tps);
      assertEquals(committed, Set.copyOf(values));
      assertEquals(4, values.size(), values.toString());
    }
    try (KafkaConsumer<byte[], byte[]> consumer = isolated("read_uncommitted")) {
      List<String> values = readToEnd(consumer, tps);
      Set<String> all = new TreeSet<>(committed);
      all.addAll(Set.of("aborted-" + first, "aborted-" + second));
      assertEquals(all, new TreeSet<>(values));
      assertEquals(6, values.size(), values.toString());
    }
    // Two records, a commit marker, one record and an abort marker in each topic.
    try (Admin admin = admin()) {
      var ends = admin.listOffsets(
          Map.of(tps.get(0), OffsetSpec.latest(), tps.get(1), OffsetSpec.latest())).all().get();
      assertEquals(5, ends.get(tps.get(0)).offset());
      assertEquals(5, ends.get(tps.get(1)).offset());
    }
  }

  /** Poll (bounded) until at least {@code count} records came; all of them. */
  static List<ConsumerRecord<byte[], byte[]>> pollAtLeast(
      KafkaConsumer<byte[], byte[]> consumer, int count) {
    List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
    long deadline = System.nanoTime() + Clients.BOUND.toNanos();
    while (out.size() < count && System.nanoTime() < deadline) {
      consumer.poll(Duration.ofMillis(200)).forEach(out::add);
    }
    assertTrue(out.size() >= count, "got " + out.size() + " records");
    return out;
  }

  static long committedOffset(String group, TopicPartition tp) throws Exception {
    try (Admin admin = admin()) {
      OffsetAndMetadata offset =
          admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().get(tp);
      return offset == null ? -1 : offset.offset();
    }
  }

  @Test
  void consumeTransformProduceCommitsTheGroupsOffsetsWithTheTransaction() throws Exception {
    String input = createTopic(1);
    String output = createTopic(1);
    TopicPartition in = new TopicPartition(input, 0);
    try (KafkaProducer<byte[], byte[]> plain = producer(Map.of())) {
      for (int i = 0; i < 6; i++) {
        plain.send(new ProducerRecord<>(input, bytes("in-" + i))).get();
      }
    }
    String group = uniqueName("txn-group");
    Map<String, Object> conf = Map.of(
        ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed",
        ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 3);
    long afterCommit;
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(group, conf);
        KafkaProducer<byte[], byte[]> producer = transactional(uniqueName("ctp"))) {
      producer.initTransactions();
      consumer.subscribe(List.of(input));

      // Transform the first poll's records and commit them with the group's offsets.
      List<ConsumerRecord<byte[], byte[]>> batch = pollAtLeast(consumer, 1);
      producer.beginTransaction();
      for (ConsumerRecord<byte[], byte[]> r : batch) {
        producer.send(new ProducerRecord<>(output, bytes("out-" + text(r.value()))));
      }
      afterCommit = batch.get(batch.size() - 1).offset() + 1;
      producer.sendOffsetsToTransaction(
          Map.of(in, new OffsetAndMetadata(afterCommit)), consumer.groupMetadata());
      producer.commitTransaction();
      assertEquals(afterCommit, committedOffset(group, in));

      // The rest is transformed too, but that transaction is aborted: the offsets stay.
      List<ConsumerRecord<byte[], byte[]>> rest = pollAtLeast(consumer, (int) (6 - afterCommit));
      producer.beginTransaction();
      for (ConsumerRecord<byte[], byte[]> r : rest) {
        producer.send(new ProducerRecord<>(output, bytes("out-" + text(r.value()))));
      }
      producer.sendOffsetsToTransaction(
          Map.of(in, new OffsetAndMetadata(6)), consumer.groupMetadata());
      producer.abortTransaction();
      assertEquals(afterCommit, committedOffset(group, in));
    }
    List<String> expected = new ArrayList<>();
    for (long i = 0; i < afterCommit; i++) {
      expected.add("out-in-" + i);
    }
    try (KafkaConsumer<byte[], byte[]> reader = isolated("read_committed")) {
      assertEquals(expected, readToEnd(reader, List.of(new TopicPartition(output, 0))));
    }
    // A new member of the group resumes where the committed transaction left it.
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(group, conf)) {
      consumer.subscribe(List.of(input));
      assertEquals(afterCommit, pollAtLeast(consumer, 1).get(0).offset());
    }
  }

  @Test
  void aSecondProducerWithTheSameTransactionalIdFencesTheFirst() throws Exception {
    String topic = createTopic(1);
    String transactionalId = uniqueName("fenced");
    try (KafkaProducer<byte[], byte[]> old = transactional(transactionalId)) {
      old.initTransactions();
      old.beginTransaction();
      old.send(new ProducerRecord<>(topic, bytes("zombie"))).get();
      try (KafkaProducer<byte[], byte[]> fresh = transactional(transactionalId)) {
        // Fences the first producer and aborts its open transaction.
        fresh.initTransactions();
        assertThrows(ProducerFencedException.class, old::commitTransaction);
        fresh.beginTransaction();
        fresh.send(new ProducerRecord<>(topic, bytes("survivor")));
        fresh.commitTransaction();
      }
    }
    try (KafkaConsumer<byte[], byte[]> reader = isolated("read_committed")) {
      assertEquals(List.of("survivor"), readToEnd(reader, List.of(new TopicPartition(topic, 0))));
    }
  }

  @Test
  void adminListsAndDescribesTransactions() throws Exception {
    String topic = createTopic(2);
    String open = uniqueName("listed-open");
    String done = uniqueName("listed-done");
    try (KafkaProducer<byte[], byte[]> ongoing = transactional(open);
        KafkaProducer<byte[], byte[]> finished = transactional(done);
        Admin admin = admin()) {
      finished.initTransactions();
      finished.beginTransaction();
      finished.send(new ProducerRecord<>(topic, 0, null, bytes("done")));
      finished.commitTransaction();
      ongoing.initTransactions();
      ongoing.beginTransaction();
      ongoing.send(new ProducerRecord<>(topic, 1, null, bytes("open"))).get();

      Map<String, TransactionListing> listed = admin.listTransactions().all().get().stream()
          .collect(Collectors.toMap(TransactionListing::transactionalId, l -> l));
      assertEquals(TransactionState.ONGOING, listed.get(open).state());
      assertEquals(TransactionState.COMPLETE_COMMIT, listed.get(done).state());

      Map<String, TransactionDescription> described =
          admin.describeTransactions(List.of(open, done)).all().get();
      TransactionDescription openOne = described.get(open);
      assertEquals(TransactionState.ONGOING, openOne.state());
      assertEquals(listed.get(open).producerId(), openOne.producerId());
      assertEquals(Set.of(new TopicPartition(topic, 1)), openOne.topicPartitions());
      assertTrue(openOne.transactionStartTimeMs().isPresent());
      assertEquals(TransactionState.COMPLETE_COMMIT, described.get(done).state());
      assertEquals(Set.of(), described.get(done).topicPartitions());

      ongoing.abortTransaction();
      assertTrue(eventually(() -> {
        try {
          return admin.describeTransactions(List.of(open)).all().get().get(open).state()
              == TransactionState.COMPLETE_ABORT;
        } catch (Exception e) {
          return false;
        }
      }));
    }
  }
}
