package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.eventually;
import static trio.broker.Clients.producer;
import static trio.broker.Clients.readAll;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Manual assignment, seeking, offsets by time, pause/resume and asynchronous commits. */
@Timeout(90)
class ConsumerTest {
  static final long T0 = 1_600_000_000_000L;

  /** Ten records per partition; record i has timestamp T0 + 1000 * i and value "p-i". */
  static String topicWithTimestamps(int partitions) throws Exception {
    String topic = createTopic(partitions);
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      for (int p = 0; p < partitions; p++) {
        for (int i = 0; i < 10; i++) {
          producer.send(new ProducerRecord<>(topic, p, T0 + 1000L * i, null, bytes(p + "-" + i)));
        }
      }
      producer.flush();
    }
    return topic;
  }

  @Test
  void assignSeekAndOffsetsForTimes() throws Exception {
    String topic = topicWithTimestamps(2);
    TopicPartition p0 = new TopicPartition(topic, 0);
    TopicPartition p1 = new TopicPartition(topic, 1);
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(null)) {
      consumer.assign(List.of(p0, p1));
      assertEquals(Set.of(p0, p1), consumer.assignment());
      assertEquals(Map.of(p0, 0L, p1, 0L), consumer.beginningOffsets(List.of(p0, p1)));
      assertEquals(Map.of(p0, 10L, p1, 10L), consumer.endOffsets(List.of(p0, p1)));
      // The first record at or after a time; none after the last one.
      Map<TopicPartition, OffsetAndTimestamp> byTime =
          consumer.offsetsForTimes(Map.of(p0, T0 + 3500L, p1, T0 + 20_000L));
      assertEquals(4L, byTime.get(p0).offset());
      assertEquals(T0 + 4000L, byTime.get(p0).timestamp());
      assertNull(byTime.get(p1));
      consumer.seek(p0, byTime.get(p0).offset());
      consumer.seek(p1, 8);
      List<ConsumerRecord<byte[], byte[]>> got = readAll(consumer, 8);
      assertEquals(8, got.size());
      Map<Integer, StringBuilder> seen = new HashMap<>();
      for (ConsumerRecord<byte[], byte[]> r : got) {
        seen.computeIfAbsent(r.partition(), k -> new StringBuilder()).append(text(r.value())).append(' ');
        assertEquals(T0 + 1000L * r.offset(), r.timestamp());
      }
      assertEquals("0-4 0-5 0-6 0-7 0-8 0-9 ", seen.get(0).toString());
      assertEquals("1-8 1-9 ", seen.get(1).toString());
      assertEquals(10, consumer.position(p0));
      consumer.seekToBeginning(List.of(p1));
      assertEquals(0, consumer.position(p1));
      consumer.seekToEnd(List.of(p0));
      assertEquals(10, consumer.position(p0));
    }
  }

  @Test
  void pausedPartitionsAreNotFetchedUntilResumed() throws Exception {
    String topic = topicWithTimestamps(2);
    TopicPartition p0 = new TopicPartition(topic, 0);
    TopicPartition p1 = new TopicPartition(topic, 1);
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(null)) {
      consumer.assign(List.of(p0, p1));
      consumer.seekToBeginning(List.of(p0, p1));
      consumer.pause(List.of(p1));
      assertEquals(Set.of(p1), consumer.paused());
      List<ConsumerRecord<byte[], byte[]>> got = readAll(consumer, 10);
      assertEquals(10, got.size());
      assertTrue(got.stream().allMatch(r -> r.partition() == 0));
      // More polls while paused: p1's ten records stay unread.
      for (int i = 0; i < 5; i++) {
        assertTrue(consumer.poll(Duration.ofMillis(100)).isEmpty());
      }
      assertEquals(0, consumer.position(p1));
      consumer.resume(List.of(p1));
      List<ConsumerRecord<byte[], byte[]>> rest = readAll(consumer, 10);
      assertEquals(10, rest.size());
      assertTrue(rest.stream().allMatch(r -> r.partition() == 1));
    }
  }

  @Test
  void commitAsyncCallsBackAndTheOffsetsAreCommitted() throws Exception {
    String topic = topicWithTimestamps(1);
    String group = uniqueName("java-async");
    TopicPartition p0 = new TopicPartition(topic, 0);
    AtomicReference<Map<TopicPartition, OffsetAndMetadata>> committed = new AtomicReference<>();
    AtomicReference<Exception> failure = new AtomicReference<>();
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(group)) {
      consumer.assign(List.of(p0));
      assertEquals(10, readAll(consumer, 10).size());
      consumer.commitAsync((offsets, error) -> {
        committed.set(offsets);
        failure.set(error);
      });
      // The callback runs inside a later poll (or commitSync/close).
      assertTrue(eventually(() -> {
        consumer.poll(Duration.ofMillis(50));
        return committed.get() != null;
      }));
      assertNull(failure.get());
      assertEquals(10, committed.get().get(p0).offset());
      consumer.commitAsync(Map.of(p0, new OffsetAndMetadata(7, "seven")), null);
      consumer.commitSync(); // flushes the pending async commit first, then commits 10 again
    }
    try (KafkaConsumer<byte[], byte[]> reader = consumer(group)) {
      OffsetAndMetadata stored = reader.committed(Set.of(p0)).get(p0);
      assertEquals(10, stored.offset());
      reader.assign(List.of(p0));
      reader.commitSync(Map.of(p0, new OffsetAndMetadata(7, "seven")));
      OffsetAndMetadata seven = reader.committed(Set.of(p0)).get(p0);
      assertEquals(7, seven.offset());
      assertEquals("seven", seven.metadata());
      // A new member of the group starts at the committed offset.
      List<ConsumerRecord<byte[], byte[]>> got = readAll(reader, 3);
      assertEquals(List.of(7L, 8L, 9L), got.stream().map(ConsumerRecord::offset).toList());
    }
  }
}
