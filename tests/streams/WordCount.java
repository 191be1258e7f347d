// Kafka Streams word count with processing.guarantee=exactly_once_v2, for
// tests/e2e/test_kafka_streams.py. Reads lines from the input topic, counts words (a
// repartition topic and a changelogged state store in between: both written inside the
// same transactions as the output and the consumed offsets), writes word -> count (long)
// to the output topic. Prints "STATE <state>" lines on stdout for the test to follow.
//
//   java -cp CLASSPATH WordCount.java BOOTSTRAP INPUT OUTPUT APPLICATION_ID STATE_DIR

import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Produced;

public class WordCount {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], input = args[1], output = args[2];
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        // One broker that is killed and restarted: come back quickly.
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10000);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 10000);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG), 5000);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG), 500);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG), 500);

        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(input)
            .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\s+")))
            .filter((key, word) -> !word.isEmpty())
            .groupBy((key, word) -> word)
            .count()
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now);
            System.out.flush();
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                stopped.countDown();
            }
        });
        // A thread that dies of an error (say, the broker went away mid-commit) is
        // replaced: exactly-once means its open transaction is aborted and redone.
        streams.setUncaughtExceptionHandler(exception -> {
            System.out.println("THREAD-ERROR " + exception);
            System.out.flush();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
        streams.start();
        stopped.await();
    }
}
