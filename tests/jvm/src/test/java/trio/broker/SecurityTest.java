package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static trio.broker.Clients.BOUND;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.property;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.config.SaslConfigs;
import org.apache.kafka.common.config.SslConfigs;
import org.apache.kafka.common.errors.SaslAuthenticationException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/** SASL PLAIN / SCRAM over plaintext and TLS, and mutual TLS, with PEM trust and key stores. */
@Timeout(90)
class SecurityTest {
  static final int COUNT = 20;

  static Map<String, Object> trustCa(Map<String, Object> conf) {
    conf.put(SslConfigs.SSL_TRUSTSTORE_TYPE_CONFIG, "PEM");
    conf.put(SslConfigs.SSL_TRUSTSTORE_LOCATION_CONFIG, property("pki.ca"));
    return conf;
  }

  static Map<String, Object> sasl(String protocol, String mechanism, String password) {
    Map<String, Object> conf = new HashMap<>();
    boolean tls = protocol.equals("SASL_SSL");
    conf.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG,
        property(tls ? "bootstrap.sasl.ssl" : "bootstrap.sasl"));
    conf.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, protocol);
    conf.put(SaslConfigs.SASL_MECHANISM, mechanism);
    String module = mechanism.equals("PLAIN")
        ? "org.apache.kafka.common.security.plain.PlainLoginModule"
        : "org.apache.kafka.common.security.scram.ScramLoginModule";
    conf.put(SaslConfigs.SASL_JAAS_CONFIG, module + " required username=\""
        + property("sasl.user") + "\" password=\"" + password + "\";");
    return tls ? trustCa(conf) : conf;
  }

  /** alice's certificate: the broker maps its subject to User:alice-cert. */
  static Map<String, Object> mtls() {
    Map<String, Object> conf = new HashMap<>();
    conf.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, property("bootstrap.mtls"));
    conf.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, "SSL");
    conf.put(SslConfigs.SSL_KEYSTORE_TYPE_CONFIG, "PEM");
    conf.put(SslConfigs.SSL_KEYSTORE_LOCATION_CONFIG, property("pki.alice"));
    return trustCa(conf);
  }

  static KafkaProducer<byte[], byte[]> producer(Map<String, Object> conf) {
    Properties p = new Properties();
    p.putAll(conf);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, (int) BOUND.toMillis());
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, (int) BOUND.toMillis());
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 15_000);
    return new KafkaProducer<>(p);
  }

  /** Produce COUNT records, then read them back in a consumer group, over {@code conf}. */
  static List<String> roundTrip(Map<String, Object> conf, String topic) throws Exception {
    try (Admin admin = admin(conf)) {
      admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
    }
    try (KafkaProducer<byte[], byte[]> producer = producer(conf)) {
      for (int i = 0; i < COUNT; i++) {
        producer.send(new ProducerRecord<>(topic, bytes(topic + "-" + i))).get();
      }
    }
    Properties p = new Properties();
    p.putAll(conf);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.GROUP_ID_CONFIG, "g-" + topic);
    p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
    List<String> got = new ArrayList<>();
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
      consumer.subscribe(List.of(topic));
      long deadline = System.nanoTime() + BOUND.toNanos();
      while (got.size() < COUNT && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
          got.add(text(r.value()));
        }
      }
      consumer.commitSync();
    }
    return got;
  }

  static List<String> expected(String topic) {
    List<String> out = new ArrayList<>();
    for (int i = 0; i < COUNT; i++) {
      out.add(topic + "-" + i);
    }
    return out;
  }

  @ParameterizedTest
  @CsvSource({
    "SASL_PLAINTEXT, PLAIN", "SASL_PLAINTEXT, SCRAM-SHA-256", "SASL_PLAINTEXT, SCRAM-SHA-512",
    "SASL_SSL, PLAIN", "SASL_SSL, SCRAM-SHA-256", "SASL_SSL, SCRAM-SHA-512"
  })
  void saslProducesAndConsumes(String protocol, String mechanism) throws Exception {
    String topic = uniqueName("java-" + protocol + "-" + mechanism).toLowerCase();
    assertEquals(expected(topic),
        roundTrip(sasl(protocol, mechanism, property("sasl.password")), topic));
  }

  @ParameterizedTest
  @CsvSource({"SASL_PLAINTEXT, PLAIN", "SASL_SSL, SCRAM-SHA-512"})
  void aWrongPasswordIsRefused(String protocol, String mechanism) throws Exception {
    try (Admin admin = admin(sasl(protocol, mechanism, "not-" + property("sasl.password")))) {
      ExecutionException refused =
          assertThrows(ExecutionException.class, () -> admin.describeCluster().nodes().get());
      assertInstanceOf(SaslAuthenticationException.class, refused.getCause());
    }
  }

  /** The principal comes from the client certificate: an ACL for it lets only that client in. */
  @Test
  void mutualTlsAuthenticatesByCertificate() throws Exception {
    String topic = uniqueName("java-mtls");
    ResourcePattern pattern = new ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL);
    List<AclBinding> acls = new ArrayList<>();
    for (AclOperation op : List.of(AclOperation.ALL)) {
      acls.add(new AclBinding(pattern,
          new AccessControlEntry("User:alice-cert", "*", op, AclPermissionType.ALLOW)));
    }
    try (Admin admin = admin()) {
      admin.createAcls(acls).all().get();
    }
    try {
      assertEquals(expected(topic), roundTrip(mtls(), topic));
      // alice over SASL is another principal: the topic's ACL does not name her.
      try (KafkaProducer<byte[], byte[]> other =
          producer(sasl("SASL_SSL", "SCRAM-SHA-256", property("sasl.password")))) {
        ExecutionException denied = assertThrows(ExecutionException.class,
            () -> other.send(new ProducerRecord<>(topic, bytes("x"))).get());
        assertInstanceOf(TopicAuthorizationException.class, denied.getCause());
      }
    } finally {
      try (Admin admin = admin()) {
        assertEquals(acls.size(),
            admin.deleteAcls(acls.stream().map(AclBinding::toFilter).toList()).all().get().size());
      }
    }
  }
}
