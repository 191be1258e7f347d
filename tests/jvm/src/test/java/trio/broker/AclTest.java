package trio.broker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static trio.broker.Clients.admin;
import static trio.broker.Clients.bytes;
import static trio.broker.Clients.consumer;
import static trio.broker.Clients.createTopic;
import static trio.broker.Clients.producer;
import static trio.broker.Clients.readAll;
import static trio.broker.Clients.uniqueName;

import java.time.Duration;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.errors.GroupAuthorizationException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * createAcls / describeAcls / deleteAcls against the broker's ACL authorizer, which lets
 * everyone in where no ACL names the resource (allow.everyone.if.no.acl.found = true). The
 * plain listener's clients are User:ANONYMOUS; an ACL for another user locks them out.
 */
@Timeout(90)
class AclTest {
  static AclBinding allowBob(ResourceType type, String name, AclOperation op) {
    return new AclBinding(new ResourcePattern(type, name, PatternType.LITERAL),
        new AccessControlEntry("User:bob", "*", op, AclPermissionType.ALLOW));
  }

  static AclBindingFilter filterFor(ResourceType type, String name) {
    return new AclBindingFilter(new ResourcePatternFilter(type, name, PatternType.LITERAL),
        AccessControlEntryFilter.ANY);
  }

  @Test
  void aclsAreCreatedDescribedEnforcedAndDeleted() throws Exception {
    String topic = createTopic(1);
    String group = uniqueName("java-acl-group");
    List<AclBinding> bindings = List.of(
        allowBob(ResourceType.TOPIC, topic, AclOperation.WRITE),
        allowBob(ResourceType.TOPIC, topic, AclOperation.DESCRIBE),
        allowBob(ResourceType.GROUP, group, AclOperation.READ));
    try (Admin admin = admin()) {
      admin.createAcls(bindings).all().get();
      Collection<AclBinding> onTopic = admin.describeAcls(filterFor(ResourceType.TOPIC, topic)).values().get();
      assertEquals(Set.copyOf(bindings.subList(0, 2)), new HashSet<>(onTopic));
      Collection<AclBinding> bobs = admin.describeAcls(new AclBindingFilter(ResourcePatternFilter.ANY,
          new AccessControlEntryFilter("User:bob", null, AclOperation.ANY, AclPermissionType.ANY)))
          .values().get();
      assertTrue(bobs.containsAll(bindings), bobs.toString());

      // Enforced: ANONYMOUS is now refused the topic and the group.
      try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
        ExecutionException denied = assertThrows(ExecutionException.class,
            () -> producer.send(new ProducerRecord<>(topic, bytes("no"))).get());
        assertInstanceOf(TopicAuthorizationException.class, denied.getCause());
      }
      String other = createTopic(1);
      try (KafkaConsumer<byte[], byte[]> consumer = consumer(group)) {
        consumer.subscribe(List.of(other));
        assertThrows(GroupAuthorizationException.class, () -> {
          for (int i = 0; i < 100; i++) {
            consumer.poll(Duration.ofMillis(100));
          }
        });
      }

      var deleted = admin.deleteAcls(List.of(filterFor(ResourceType.TOPIC, topic),
          filterFor(ResourceType.GROUP, group))).all().get();
      assertEquals(Set.copyOf(bindings), new HashSet<>(deleted));
      assertTrue(admin.describeAcls(filterFor(ResourceType.TOPIC, topic)).values().get().isEmpty());
    }
    // Open again: the write and the group work.
    try (KafkaProducer<byte[], byte[]> producer = producer(Map.of())) {
      assertEquals(0, producer.send(new ProducerRecord<>(topic, bytes("yes"))).get().offset());
    }
    try (KafkaConsumer<byte[], byte[]> consumer = consumer(group)) {
      consumer.subscribe(List.of(topic));
      assertEquals(1, readAll(consumer, 1).size());
      consumer.commitSync();
    }
  }
}
