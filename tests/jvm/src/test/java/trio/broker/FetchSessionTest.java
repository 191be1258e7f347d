package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.producer;
import static trio.broker.Clients.property;
import static trio.broker.Clients.text;
import static trio.broker.Clients.uniqueName;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Incremental fetch sessions (KIP-227): two consumers of one group read a topic through a
 * rebalance; the broker's /metrics (-Dmetrics.url) show that incremental fetches were taken.
 *
 * <p>Run by tests/e2e/test_java_fetch_sessions.py (-Dtest=FetchSessionTest) against a broker
 * with a metrics listener; the pom leaves it out of the full run, whose broker has none.
 */
@Timeout(120)
class FetchSessionTest {
  static final int PARTITIONS = 4;
  static final int PER_ROUND = 100;

  static double metric(String name) throws Exception {
    HttpResponse<String> page =
        HttpClient.newHttpClient()
            .send(
                HttpRequest.newBuilder(URI.create(property("metrics.url"))).build(),
                HttpResponse.BodyHandlers.ofString());
    for (String line : page.body().split("\n")) {
      if (line.startsWith(name + " ")) {
        return Double.parseDouble(line.substring(name.length() + 1).trim());
      }
    }
    return 0;
  }

  static void produce(String topic, int first) {
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      for (int i = first; i < first + PER_ROUND; i++) {
        producer.send(new ProducerRecord<>(topic, i % PARTITIONS, null, bytes("r-" + i)));
      }
      producer.flush();
    }
  }

  /** One poll; the records count as read once their offsets are committed. */
  static void pollAndCommit(KafkaConsumer<byte[], byte[]> consumer, List<String> read) {
    List<String> got = new ArrayList<>();
    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
      got.add(text(r.value()));
    }
    if (!got.isEmpty()) {
      consumer.commitSync();
      read.addAll(got);
    }
  }

  @Test
  void consumersReadThroughSessionsAcrossARebalance() throws Exception {
    String topic = createTopic(PARTITIONS);
    String group = uniqueName("sessions");
    double before = metric("trio_broker_incremental_fetches_total");
    List<String> read = new ArrayList<>();
    long deadline = System.nanoTime() + Duration.ofSeconds(90).toNanos();
    try (KafkaConsumer<byte[], byte[]> first = consumer(group);
        KafkaConsumer<byte[], byte[]> second = consumer(group)) {
      first.subscribe(List.of(topic));
      produce(topic, 0);
      while (read.size() < PER_ROUND && System.nanoTime() < deadline) {
        pollAndCommit(first, read);
      }
      assertEquals(PER_ROUND, read.size());
      double afterFirst = metric("trio_broker_incremental_fetches_total");
      assertTrue(afterFirst > before, "no incremental fetches: " + before + " -> " + afterFirst);

      // The second member joins; both poll (one thread) until each holds part of the topic.
      second.subscribe(List.of(topic));
      while ((first.assignment().isEmpty()
              || second.assignment().isEmpty()
              || first.assignment().size() + second.assignment().size() != PARTITIONS)
          && System.nanoTime() < deadline) {
        pollAndCommit(first, read);
        pollAndCommit(second, read);
      }
      assertEquals(PARTITIONS, first.assignment().size() + second.assignment().size());
      produce(topic, PER_ROUND);
      while (read.size() < 2 * PER_ROUND && System.nanoTime() < deadline) {
        pollAndCommit(first, read);
        pollAndCommit(second, read);
      }
      assertTrue(metric("trio_broker_incremental_fetches_total") > afterFirst);
      assertTrue(metric("trio_broker_fetch_sessions") >= 2);
    }
    // Exactly once: 2 * PER_ROUND distinct records, none twice.
    Set<String> distinct = new HashSet<>(read);
    assertEquals(2 * PER_ROUND, read.size());
    assertEquals(2 * PER_ROUND, distinct.size());
  }
}
