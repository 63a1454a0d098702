package peer;

import java.time.Duration;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * RocketMQ 5 gRPC producer benchmark (official rocketmq-client-java 5.0.8).
 *
 * <pre>
 * Produce ENDPOINT TOPIC THREADS COUNT SIZE
 *   THREADS threads share ONE Producer; each thread sends COUNT messages (so total = THREADS*COUNT)
 *   of SIZE random bytes, one at a time with the blocking send().
 * -Dpeer.ssl=true       TLS (default plaintext; the proxy accepts both: tls.server.mode defaults to
 *                       "permissive", rmq@5.3.3 remoting/.../netty/TlsSystemConfig.java)
 * -Dpeer.timeoutMs=3000 request timeout     -Dpeer.warmup=0 untimed sends before the run
 * -Dpeer.tag=bench      message tag
 * Prints: produce: N msgs in T s: R msgs/s p50 X ms p99 Y ms[, errors E]
 * </pre>
 *
 * API (all from rmqc@5.0.8 java/client-apis/src/main/java/org/apache/rocketmq/client/apis/):
 * ClientServiceProvider.loadService(), ClientConfiguration.newBuilder().setEndpoints(String)
 * .enableSsl(boolean) [default true in ClientConfigurationBuilder.java] .setRequestTimeout(Duration),
 * provider.newProducerBuilder().setClientConfiguration().setTopics(String...).build(),
 * Producer.send(Message) (blocking), provider.newMessageBuilder().setTopic().setTag().setBody().build().
 * The proxy rejects empty bodies (ProxyConfig.enableMessageBodyEmptyCheck=true) and bodies over
 * 4 MiB (ProxyConfig.maxMessageSize), rmq@5.3.3 proxy/.../config/ProxyConfig.java.
 */
public final class Produce {
    private Produce() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: Produce ENDPOINT TOPIC THREADS COUNT_PER_THREAD SIZE_BYTES");
            System.exit(2);
        }
        final String endpoint = args[0];
        final String topic = args[1];
        final int threads = Lat.intArg(args[2], "THREADS");
        final int count = Lat.intArg(args[3], "COUNT");
        final int size = Lat.intArg(args[4], "SIZE");
        if (threads < 1 || count < 1 || size < 1) {
            throw new IllegalArgumentException("THREADS, COUNT and SIZE must be >= 1");
        }
        final boolean ssl = Boolean.getBoolean("peer.ssl");
        final long timeoutMs = Long.getLong("peer.timeoutMs", 3000L);
        final int warmup = Integer.getInteger("peer.warmup", 0);
        final String tag = System.getProperty("peer.tag", "bench");

        final ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration cfg = ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(ssl)
            .setRequestTimeout(Duration.ofMillis(timeoutMs))
            .build();
        final Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(cfg)
            .setTopics(topic)
            .build();

        final byte[] body = new byte[size];
        new Random(42).nextBytes(body);

        for (int i = 0; i < warmup; i++) {
            try {
                producer.send(message(provider, topic, tag, body));
            } catch (Exception e) {
                System.err.println("warmup send failed: " + e);
            }
        }

        Lat.handshake();
        final long[][] lat = new long[threads][count];
        final int[] done = new int[threads];
        final AtomicLong errors = new AtomicLong();
        final CountDownLatch go = new CountDownLatch(1);
        Thread[] ts = new Thread[threads];
        for (int t = 0; t < threads; t++) {
            final int id = t;
            ts[t] = new Thread(() -> {
                try {
                    go.await();
                } catch (InterruptedException e) {
                    return;
                }
                long[] mine = lat[id];
                int k = 0;
                for (int i = 0; i < count; i++) {
                    long t0 = System.nanoTime();
                    try {
                        producer.send(message(provider, topic, tag, body));
                        mine[k++] = System.nanoTime() - t0;
                    } catch (Exception e) {
                        if (errors.incrementAndGet() <= 5) {
                            System.err.println("send failed: " + e);
                        }
                    }
                }
                done[id] = k;
            }, "produce-" + t);
            ts[t].start();
        }
        long start = System.nanoTime();
        go.countDown();
        for (Thread t : ts) {
            t.join();
        }
        long elapsed = System.nanoTime() - start;

        System.out.println(Lat.produceLine(Lat.mergeSorted(lat, done), elapsed, errors.get()));
        System.out.flush();
        try {
            producer.close();
        } catch (Exception ignored) {
            // closing is best effort
        }
        System.exit(errors.get() > 0 ? 1 : 0);
    }

    private static Message message(ClientServiceProvider provider, String topic, String tag, byte[] body) {
        return provider.newMessageBuilder().setTopic(topic).setTag(tag).setBody(body).build();
    }
}
