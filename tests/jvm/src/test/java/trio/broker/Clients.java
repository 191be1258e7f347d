package trio.broker;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Client factories for the tests. The broker addresses come from system properties set by
 * tests/e2e/test_java_client.py: bootstrap (PLAINTEXT), bootstrap.sasl (SASL_PLAINTEXT),
 * bootstrap.sasl.ssl (SASL_SSL), bootstrap.mtls (SSL with client certificates); pki.ca and
 * pki.alice are PEM files (CA certificate; alice's PKCS#8 key followed by her certificate).
 */
final class Clients {
  static final String BOOTSTRAP = System.getProperty("bootstrap", "127.0.0.1:9092");
  /** The bound of every wait in the tests. */
  static final Duration BOUND = Duration.ofSeconds(30);

  private Clients() {}

  static String property(String name) {
    String value = System.getProperty(name);
    if (value == null || value.isEmpty() || value.startsWith("${")) {
      throw new IllegalStateException("system property " + name + " is not set");
    }
    return value;
  }

  /** Client settings for the plain listener, or an empty map to add security settings to. */
  static Map<String, Object> plain() {
    Map<String, Object> conf = new HashMap<>();
    conf.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
    return conf;
  }

  static Admin admin() {
    return admin(plain());
  }

  static Admin admin(Map<String, Object> conf) {
    Map<String, Object> all = new HashMap<>(conf);
    all.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) BOUND.toMillis());
    all.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 15_000);
    return Admin.create(all);
  }

  static String uniqueName(String prefix) {
    return prefix + "-" + UUID.randomUUID();
  }

  static String createTopic(int partitions) throws Exception {
    return createTopic(partitions, Map.of());
  }

  static String createTopic(int partitions, Map<String, String> configs) throws Exception {
    String name = uniqueName("java");
    try (Admin admin = admin()) {
      admin
          .createTopics(List.of(new NewTopic(name, partitions, (short) 1).configs(configs)))
          .all()
          .get();
    }
    return name;
  }

  static KafkaProducer<byte[], byte[]> producer(Map<String, Object> extra) {
    Properties p = new Properties();
    p.putAll(plain());
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, (int) BOUND.toMillis());
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, (int) BOUND.toMillis());
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 15_000);
    p.putAll(extra);
    return new KafkaProducer<>(p);
  }

  static KafkaConsumer<byte[], byte[]> consumer(String group) {
    return consumer(group, Map.of());
  }

  /** A consumer reading from the earliest offset, auto-commit off, fast heartbeats. */
  static KafkaConsumer<byte[], byte[]> consumer(String group, Map<String, Object> extra) {
    Properties p = new Properties();
    p.putAll(plain());
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
    p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 10_000);
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) BOUND.toMillis());
    if (group != null) {
      p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    }
    p.putAll(extra);
    return new KafkaConsumer<>(p);
  }

  static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static String text(byte[] b) {
    return new String(b, StandardCharsets.UTF_8);
  }

  /** Poll until {@code count} records arrived or {@link #BOUND} passed. */
  static List<ConsumerRecord<byte[], byte[]>> readAll(
      KafkaConsumer<byte[], byte[]> consumer, int count) {
    List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
    long deadline = System.nanoTime() + BOUND.toNanos();
    while (out.size() < count && System.nanoTime() < deadline) {
      consumer.poll(Duration.ofMillis(200)).forEach(out::add);
    }
    return out;
  }

  /** Wait (bounded) for a condition; false if it never held. */
  static boolean eventually(BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + BOUND.toNanos();
    while (System.nanoTime() < deadline) {
      if (condition.getAsBoolean()) {
        return true;
      }
      Thread.sleep(100);
    }
    return condition.getAsBoolean();
  }
}
