// A Kafka 4.x Java client run by tests/integration/test_transactions_v2.py (java's
// source-file mode, Kafka's libs on the classpath). Prints one line per outcome:
//   COMMITTED <txn> / ABORTED <txn> / ZOMBIE <exception class> / ZOMBIE_ABORT <class>
//   OFFSET <committed offset of the group> / READ <value> (read_committed, in order);
// with "commits N": COMMITTED t<i> for N transactions (RETRY t<i> <error> for an aborted try)
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TransactionsV2Client {
    static String bootstrap;

    static KafkaProducer<String, String> producer(String transactionalId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        KafkaProducer<String, String> producer = new KafkaProducer<>(p);
        producer.initTransactions();
        return producer;
    }

    static KafkaConsumer<String, String> consumer(String group) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return new KafkaConsumer<>(c);
    }

    static void send(KafkaProducer<String, String> p, String topic, int partitions, String prefix) {
        for (int i = 0; i < 4; i++)
            p.send(new ProducerRecord<>(topic, i % partitions, null, prefix + "-" + i));
    }

    /** Everything committed in ``topic`` (all partitions, partition by partition). */
    static List<String> readCommitted(String topic, int partitions) {
        List<String> out = new ArrayList<>();
        try (KafkaConsumer<String, String> c = consumer("reader-" + UUID.randomUUID())) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(topic, i));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps);   // the LSO under read_committed
            Map<TopicPartition, List<String>> by = new HashMap<>();
            long deadline = System.currentTimeMillis() + 30000;
            while (tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("read timed out");
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200)))
                    by.computeIfAbsent(new TopicPartition(r.topic(), r.partition()), k -> new ArrayList<>()).add(r.value());
            }
            for (TopicPartition tp : tps) out.addAll(by.getOrDefault(tp, List.of()));
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        String input = args[1], output = args[2], tid = args[3], group = args[4];
        int partitions = Integer.parseInt(args[5]);
        if (args.length > 6) {   // "commits N": N committed transactions, nothing else
            KafkaProducer<String, String> p = producer(tid);
            for (int i = 0; i < Integer.parseInt(args[7]); ) {
                try {
                    p.beginTransaction();
                    send(p, input, partitions, "t" + i);
                    p.commitTransaction();
                    System.out.println("COMMITTED t" + i);
                    i++;
                } catch (ProducerFencedException | OutOfOrderSequenceException
                         | AuthorizationException e) {
                    throw e;     // fatal: the test fails
                } catch (KafkaException e) {
                    // abortable (a coordinator or leader lost meanwhile): abort, try i again
                    System.out.println("RETRY t" + i + " " + e.getClass().getSimpleName());
                    p.abortTransaction();
                }
            }
            p.close();
            return;
        }

        KafkaProducer<String, String> p1 = producer(tid);
        p1.beginTransaction();
        send(p1, input, partitions, "c1");
        p1.commitTransaction();
        System.out.println("COMMITTED c1");
        p1.beginTransaction();
        send(p1, input, partitions, "a1");
        p1.flush();
        p1.abortTransaction();
        System.out.println("ABORTED a1");
        p1.beginTransaction();
        send(p1, input, partitions, "c2");
        p1.commitTransaction();
        System.out.println("COMMITTED c2");

        // consume-transform-produce: the group's offsets go with the transaction (no
        // AddOffsetsToTxn from a V2 client: TxnOffsetCommit v5 adds them)
        try (KafkaConsumer<String, String> c = consumer(group)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(input, i));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps);
            p1.beginTransaction();
            long deadline = System.currentTimeMillis() + 30000;
            while (tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("copy timed out");
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200)))
                    p1.send(new ProducerRecord<>(output, r.partition(), null, "copy-" + r.value()));
            }
            Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
            for (TopicPartition tp : tps) offsets.put(tp, new OffsetAndMetadata(c.position(tp)));
            p1.sendOffsetsToTransaction(offsets, c.groupMetadata());
            p1.commitTransaction();
            System.out.println("COMMITTED copy");
            long committed = 0;
            for (OffsetAndMetadata o : c.committed(new HashSet<>(tps)).values()) committed += o.offset();
            System.out.println("OFFSET " + committed);
        }

        // a second producer with the same transactional id fences the first
        KafkaProducer<String, String> p2 = producer(tid);
        try {
            p1.beginTransaction();
            send(p1, input, partitions, "zombie");
            p1.commitTransaction();
            System.out.println("ZOMBIE committed");
        } catch (KafkaException e) {
            System.out.println("ZOMBIE " + e.getClass().getSimpleName());
            try {
                p1.abortTransaction();
                System.out.println("ZOMBIE_ABORT done");
            } catch (KafkaException e2) {
                System.out.println("ZOMBIE_ABORT " + e2.getClass().getSimpleName());
            }
        }
        p1.close(Duration.ofSeconds(5));
        p2.beginTransaction();
        send(p2, input, partitions, "c3");
        p2.commitTransaction();
        System.out.println("COMMITTED c3");
        p2.close();
        for (String v : readCommitted(input, partitions)) System.out.println("READ " + v);
        for (String v : readCommitted(output, partitions)) System.out.println("READ_OUT " + v);
    }
}
