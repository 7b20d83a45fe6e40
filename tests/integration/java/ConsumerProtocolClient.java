// A Kafka consumer with group.protocol=consumer (KIP-848), driven through stdin: it prints
// "ASSIGNMENT <partitions>" whenever its assignment changes, "CONSUMED <n>" as records arrive;
// "commit" commits synchronously ("COMMITTED"), "quit" closes it (leaving the group) and exits.
// Usage: java ConsumerProtocolClient.java <bootstrap> <group> <topic|regex:pattern> <client-id> [instance-id]
import java.time.Duration;
import java.util.*;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ConsumerProtocolClient {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("group.id", args[1]);
        p.put("group.protocol", "consumer");
        p.put("client.id", args[3]);
        if (args.length > 4) p.put("group.instance.id", args[4]);
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        LinkedBlockingQueue<String> commands = new LinkedBlockingQueue<>();
        Thread reader = new Thread(() -> {
            Scanner in = new Scanner(System.in);
            while (in.hasNextLine()) commands.add(in.nextLine().trim());
            commands.add("quit");
        });
        reader.setDaemon(true);
        reader.start();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p)) {
            ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> parts) { report(consumer); }
                public void onPartitionsAssigned(Collection<TopicPartition> parts) { report(consumer); }
            };
            if (args[2].startsWith("regex:")) {
                consumer.subscribe(new SubscriptionPattern(args[2].substring(6)), listener);
            } else {
                consumer.subscribe(List.of(args[2]), listener);
            }
            long consumed = 0;
            while (true) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (!records.isEmpty()) {
                    consumed += records.count();
                    System.out.println("CONSUMED " + consumed);
                }
                String command = commands.poll();
                if (command == null) continue;
                if (command.equals("commit")) {
                    consumer.commitSync();
                    System.out.println("COMMITTED");
                } else if (command.equals("quit")) {
                    break;
                }
            }
        }
        System.out.println("CLOSED");
    }

    static void report(KafkaConsumer<String, String> consumer) {
        List<String> parts = new ArrayList<>();
        for (TopicPartition tp : consumer.assignment()) parts.add(tp.topic() + "-" + tp.partition());
        Collections.sort(parts);
        System.out.println("ASSIGNMENT " + String.join(",", parts));
    }
}
