package peer;

import java.time.Duration;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;

/**
 * RocketMQ 5 gRPC SimpleConsumer benchmark (official rocketmq-client-java 5.0.8).
 *
 * <pre>
 * Consume ENDPOINT TOPIC GROUP THREADS COUNT
 *   THREADS threads share ONE SimpleConsumer; each loops receive(maxMessageNum, invisibleDuration)
 *   and acks every message, until COUNT (TOTAL, all threads) are acked.
 * -Dpeer.batch=32  -Dpeer.invisibleSec=30  -Dpeer.awaitSec=5 (long-polling wait)
 * -Dpeer.idleSec=30 give up after this long without a message   -Dpeer.ssl / -Dpeer.timeoutMs as Produce
 * Prints: consume: N msgs in T s: R msgs/s[, redelivered D][, errors E]
 * </pre>
 *
 * API (rmqc@5.0.8 java/client-apis/.../consumer/SimpleConsumerBuilder.java, SimpleConsumer.java):
 * setClientConfiguration, setConsumerGroup, setSubscriptionExpressions(Map), setAwaitDuration(Duration),
 * receive(int maxMessageNum, Duration invisibleDuration), ack(MessageView); FilterExpression.SUB_ALL ("*").
 * An empty poll is not an error: MESSAGE_NOT_FOUND on a ReceiveMessageRequest returns normally
 * (rmqc@5.0.8 java/client/.../exception/StatusChecker.java).
 * Proxy side: the long-polling time is clamped to [5 s, 20 s]
 * (ProxyConfig.grpcClientConsumerMin/MaxLongPollingTimeoutMillis; grpc/v2/consumer/ReceiveMessageActivity.java),
 * and invisibleDuration must be >= 10 s (ProxyConfig.minInvisibleTimeMillsForRecv), rmq@5.3.3.
 * Where a NEW group starts: the proxy pops with ConsumeInitMode.MAX (ReceiveMessageActivity.java), and the
 * broker then starts at offset 0 only if initPopOffsetByCheckMsgInMem (default true, BrokerConfig.java) and
 * the queue's min offset is 0 and message 0 is "in memory" (PopMessageProcessor.getInitOffset); on JDK 17
 * DefaultMappedFile.isLoaded() always answers true (MappedByteBuffer has no isLoaded0 there, so
 * IS_LOADED_METHOD is null, store/.../logfile/DefaultMappedFile.java), so a fresh group on a fresh store
 * reads from the start.  Otherwise it starts at the END of the queue: produce after starting, or use a
 * group that already consumed.
 */
public final class Consume {
    private Consume() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: Consume ENDPOINT TOPIC GROUP THREADS TOTAL_COUNT");
            System.exit(2);
        }
        final String endpoint = args[0];
        final String topic = args[1];
        final String group = args[2];
        final int threads = Lat.intArg(args[3], "THREADS");
        final long count = Lat.intArg(args[4], "COUNT");
        if (threads < 1 || count < 1) {
            throw new IllegalArgumentException("THREADS and COUNT must be >= 1");
        }
        final boolean ssl = Boolean.getBoolean("peer.ssl");
        final long timeoutMs = Long.getLong("peer.timeoutMs", 3000L);
        final int batch = Integer.getInteger("peer.batch", 32);
        final Duration invisible = Duration.ofSeconds(Long.getLong("peer.invisibleSec", 30L));
        final Duration await = Duration.ofSeconds(Long.getLong("peer.awaitSec", 5L));
        final long idleNanos = Duration.ofSeconds(Long.getLong("peer.idleSec", 30L)).toNanos();

        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration cfg = ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(ssl)
            .setRequestTimeout(Duration.ofMillis(timeoutMs))
            .build();
        final SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(cfg)
            .setConsumerGroup(group)
            .setAwaitDuration(await)
            .setSubscriptionExpressions(Collections.singletonMap(topic, FilterExpression.SUB_ALL))
            .build();

        final AtomicLong acked = new AtomicLong();
        final AtomicLong redelivered = new AtomicLong();
        final AtomicLong errors = new AtomicLong();
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicLong endNanos = new AtomicLong();
        Lat.handshake();
        final long start = System.nanoTime();
        final AtomicLong lastProgress = new AtomicLong(start);

        Thread[] ts = new Thread[threads];
        for (int t = 0; t < threads; t++) {
            ts[t] = new Thread(() -> {
                while (!stop.get()) {
                    List<MessageView> got;
                    try {
                        got = consumer.receive(batch, invisible);
                    } catch (Exception e) {
                        if (errors.incrementAndGet() <= 5) {
                            System.err.println("receive failed: " + e);
                        }
                        sleepQuietly(100);
                        continue;
                    }
                    long now = System.nanoTime();
                    if (got.isEmpty()) {
                        if (now - lastProgress.get() > idleNanos) {
                            stop.set(true);
                        }
                        continue;
                    }
                    lastProgress.set(now);
                    // ack the whole batch even past COUNT, so nothing is left invisible for the next run
                    for (MessageView m : got) {
                        try {
                            consumer.ack(m);
                            if (m.getDeliveryAttempt() > 1) {
                                redelivered.incrementAndGet();
                            }
                            if (acked.incrementAndGet() == count) {
                                endNanos.set(System.nanoTime());
                                stop.set(true);
                            }
                        } catch (Exception e) {
                            if (errors.incrementAndGet() <= 5) {
                                System.err.println("ack failed: " + e);
                            }
                        }
                    }
                }
            }, "consume-" + t);
            ts[t].start();
        }
        for (Thread t : ts) {
            t.join();
        }

        boolean complete = endNanos.get() != 0;
        long end = complete ? endNanos.get() : lastProgress.get();
        long n = complete ? count : acked.get();
        double secs = (end - start) / 1e9;
        StringBuilder line = new StringBuilder(String.format("consume: %d msgs in %.1f s: %.0f msgs/s",
            n, secs, secs > 0 ? n / secs : 0.0));
        if (acked.get() > n) {
            line.append(", extra acked ").append(acked.get() - n);
        }
        if (redelivered.get() > 0) {
            line.append(", redelivered ").append(redelivered.get());
        }
        if (errors.get() > 0) {
            line.append(", errors ").append(errors.get());
        }
        if (!complete) {
            line.append(" (INCOMPLETE: no message for ").append(idleNanos / 1_000_000_000L).append(" s)");
        }
        System.out.println(line);
        System.out.flush();
        try {
            consumer.close();
        } catch (Exception ignored) {
            // closing is best effort
        }
        System.exit(complete && errors.get() == 0 ? 0 : 1);
    }

    private static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
