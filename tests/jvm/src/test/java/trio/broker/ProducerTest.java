package trio.broker;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.producer;
import static trio.broker.Clients.readAll;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RecordTooLargeException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** Producer acknowledgement modes and record sizes at the limit. */
@Timeout(90)
class ProducerTest {
  static List<ConsumerRecord<byte[], byte[]>> readPartition(String topic, int count) {
    try (KafkaConsumer<byte[], byte[]> consumer =
        consumer(null, Map.of(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, 4 << 20))) {
      TopicPartition tp = new TopicPartition(topic, 0);
      consumer.assign(List.of(tp));
      consumer.seekToBeginning(List.of(tp));
      return readAll(consumer, count);
    }
  }

  /** acks=0 gets no offsets back (-1), acks=1 and all do; every record is stored once. */
  @ParameterizedTest
  @ValueSource(strings = {"0", "1", "all"})
  void everyAcksModeStoresTheRecords(String acks) throws Exception {
    String topic = createTopic(1);
    int count = 200;
    List<Future<RecordMetadata>> sent = new ArrayList<>();
    try (KafkaProducer<byte[], byte[]> producer =
        producer(Map.of(ProducerConfig.ACKS_CONFIG, acks,
            ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, acks.equals("all")))) {
      for (int i = 0; i < count; i++) {
        sent.add(producer.send(new ProducerRecord<>(topic, bytes("k" + i), bytes(acks + "-" + i))));
      }
      producer.flush();
    }
    for (int i = 0; i < count; i++) {
      long offset = sent.get(i).get().offset();
      assertEquals(acks.equals("0") ? -1 : i, offset, "offset reported for record " + i);
    }
    List<ConsumerRecord<byte[], byte[]>> got = readPartition(topic, count);
    assertEquals(count, got.size());
    for (int i = 0; i < count; i++) {
      assertEquals(i, got.get(i).offset());
      assertArrayEquals(bytes(acks + "-" + i), got.get(i).value());
    }
  }

  /** A record just under the topic's max.message.bytes is stored; one just over is refused. */
  @Test
  void recordsNearMaxMessageBytes() throws Exception {
    int limit = 100_000;
    String topic = createTopic(1, Map.of("max.message.bytes", Integer.toString(limit)));
    // A batch of one record costs 61 bytes of batch header and ~10 of record framing.
    byte[] fits = new byte[limit - 200];
    byte[] tooBig = new byte[limit + 1];
    Arrays.fill(fits, (byte) 'f');
    Arrays.fill(tooBig, (byte) 't');
    try (KafkaProducer<byte[], byte[]> producer =
        producer(Map.of(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, 4 << 20))) {
      assertEquals(0, producer.send(new ProducerRecord<>(topic, fits)).get().offset());
      ExecutionException refused = assertThrows(ExecutionException.class,
          () -> producer.send(new ProducerRecord<>(topic, tooBig)).get());
      assertInstanceOf(RecordTooLargeException.class, refused.getCause());
      assertEquals(1, producer.send(new ProducerRecord<>(topic, bytes("after"))).get().offset());
    }
    List<ConsumerRecord<byte[], byte[]>> got = readPartition(topic, 2);
    assertEquals(2, got.size());
    assertArrayEquals(fits, got.get(0).value());
    assertArrayEquals(bytes("after"), got.get(1).value());
  }

  /** A record of almost 1 MiB under the broker default message.max.bytes (1048588). */
  @Test
  void aOneMegabyteRecordRoundTrips() throws Exception {
    String topic = createTopic(1);
    byte[] big = new byte[1_048_000];
    for (int i = 0; i < big.length; i++) {
      big[i] = (byte) (i * 31);
    }
    try (KafkaProducer<byte[], byte[]> producer =
        producer(Map.of(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, 4 << 20))) {
      assertEquals(0, producer.send(new ProducerRecord<>(topic, big)).get().offset());
    }
    List<ConsumerRecord<byte[], byte[]>> got = readPartition(topic, 1);
    assertEquals(1, got.size());
    assertArrayEquals(big, got.get(0).value());
  }
}
