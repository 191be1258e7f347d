package trio.broker;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** The Java client, unchanged, against a trio-broker serve process (-Dbootstrap). */
class JavaClientTest {
  static final String BOOTSTRAP = System.getProperty("bootstrap", "127.0.0.1:9092");
  static final Duration BOUND = Duration.ofSeconds(30);

  static Admin admin() {
    return Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP));
  }

  static String createTopic(int partitions) throws Exception {
    String name = "java-" + UUID.randomUUID();
    try (Admin admin = admin()) {
      admin.createTopics(List.of(new NewTopic(name, partitions, (short) 1))).all().get();
    }
    return name;
  }

  static KafkaProducer<byte[], byte[]> producer(Map<String, Object> extra) {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.putAll(extra);
    return new KafkaProducer<>(p);
  }

  static KafkaConsumer<byte[], byte[]> consumer(String group) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    if (group != null) {
      p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    }
    return new KafkaConsumer<>(p);
  }

  static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static List<ConsumerRecord<byte[], byte[]>> readAll(
      KafkaConsumer<byte[], byte[]> consumer, int count) {
    List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
    long deadline = System.nanoTime() + BOUND.toNanos();
    while (out.size() < count && System.nanoTime() < deadline) {
      consumer.poll(Duration.ofMillis(500)).forEach(out::add);
    }
    return out;
  }

  /** The Java defaults: acks=all with idempotence; a consumer group reads everything back. */
  @Test
  void producesIdempotentlyAndAGroupReadsItBack() throws Exception {
    String topic = createTopic(3);
    int count = 600;
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
      for (int i = 0; i < count; i++) {
        ProducerRecord<byte[], byte[]> record =
            new ProducerRecord<>(topic, null, 1_700_000_000_000L + i, bytes("k" + i), bytes("v" + i));
        record.headers().add("n", bytes(Integer.toString(i)));
        sent.add(producer.send(record));
      }
      producer.flush();
      for (var future : sent) {
        assertTrue(future.get().offset() >= 0);
      }
    }
    try (KafkaConsumer<byte[], byte[]> consumer = consumer("java-group-" + topic)) {
      consumer.subscribe(List.of(topic));
      List<ConsumerRecord<byte[], byte[]>> got = readAll(consumer, count);
      assertEquals(count, got.size());
      Set<String> values = new java.util.HashSet<>();
      for (ConsumerRecord<byte[], byte[]> r : got) {
        String value = new String(r.value(), StandardCharsets.UTF_8);
        String n = new String(r.headers().lastHeader("n").value(), StandardCharsets.UTF_8);
        assertEquals("v" + n, value);
        assertEquals(1_700_000_000_000L + Integer.parseInt(n), r.timestamp());
        values.add(value);
      }
      assertEquals(count, values.size(), "no record twice");
      consumer.commitSync();
      long committed = 0;
      for (int p = 0; p < 3; p++) {
        var offset = consumer.committed(Set.of(new TopicPartition(topic, p))).values();
        for (var o : offset) {
          committed += o == null ? 0 : o.offset();
        }
      }
      assertEquals(count, committed);
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"none", "gzip", "snappy", "lz4", "zstd"})
  void everyCompressionCodecRoundTrips(String codec) throws Exception {
    String topic = createTopic(1);
    try (KafkaProducer<byte[], byte[]> producer =
        producer(Map.of(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec, ProducerConfig.ACKS_CONFIG, "1",
            ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false))) {
      for (int i = 0; i < 100; i++) {
        producer.send(new ProducerRecord<>(topic, bytes("k" + i), bytes(codec + "-" + i)));
      }
      producer.flush();
    }
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(null)) {
      TopicPartition tp = new TopicPartition(topic, 0);
      consumer.assign(List.of(tp));
      consumer.seekToBeginning(List.of(tp));
      List<ConsumerRecord<byte[], byte[]>> got = readAll(consumer, 100);
      assertEquals(100, got.size());
      for (int i = 0; i < 100; i++) {
        assertArrayEquals(bytes(codec + "-" + i), got.get(i).value());
        assertEquals(i, got.get(i).offset());
      }
    }
  }

  @Test
  void adminDescribesTheClusterAndListsOffsets() throws Exception {
    String topic = createTopic(2);
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      for (int i = 0; i < 10; i++) {
        producer.send(new ProducerRecord<>(topic, 1, bytes("k"), bytes("v" + i))).get();
      }
    }
    try (Admin admin = admin()) {
      DescribeClusterResult cluster = admin.describeCluster();
      assertFalse(cluster.clusterId().get().isEmpty());
      assertEquals(1, cluster.nodes().get().size());
      assertTrue(admin.listTopics().names().get().contains(topic));
      ListOffsetsResult offsets =
          admin.listOffsets(Map.of(new TopicPartition(topic, 1), OffsetSpec.latest()));
      assertEquals(10, offsets.partitionResult(new TopicPartition(topic, 1)).get().offset());
      var described = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
      assertEquals(2, described.partitions().size());
    }
  }
}
