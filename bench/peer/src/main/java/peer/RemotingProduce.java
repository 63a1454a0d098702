package peer;

import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * Remoting-protocol producer benchmark (4.x-style DefaultMQProducer from rocketmq-client 5.3.3).
 *
 * <pre>
 * RemotingProduce NAMESRV TOPIC THREADS COUNT SIZE
 *   NAMESRV: host:port that answers GET_ROUTEINFO_BY_TOPIC. The name server (routes to the broker's
 *   own listenPort, e.g. 127.0.0.1:20911), or the proxy's remoting port (the proxy answers routes with
 *   itself: remotingAccessAddr:remotingListenPort, rmq@5.3.3 proxy/.../remoting/RemotingProtocolServer.java
 *   and remoting/activity/GetTopicRouteActivity.java).  rocketstore does not speak this protocol.
 *   THREADS threads share ONE producer; each sends COUNT messages (total THREADS*COUNT) of SIZE bytes, sync.
 * -Dpeer.timeoutMs=3000 sendMsgTimeout   -Dpeer.tag=bench   -Dpeer.group=peer_remoting_producer
 * Prints the same line as Produce.
 * </pre>
 *
 * rmq@5.3.3 client/src/main/java/org/apache/rocketmq/client/producer/DefaultMQProducer.java:
 * compressMsgBodyOverHowmuch defaults to 4 KiB (bodies above it are compressed), disabled here so the
 * broker stores the same bytes the gRPC client sends; retryTimesWhenSendFailed=2 kept (default);
 * ClientConfig.vipChannelEnabled defaults to false (com.rocketmq.sendMessageWithVIPChannel), so sends go to
 * listenPort, not the "fast" port listenPort-2.
 */
public final class RemotingProduce {
    private RemotingProduce() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: RemotingProduce NAMESRV_ADDR TOPIC THREADS COUNT_PER_THREAD SIZE_BYTES");
            System.exit(2);
        }
        final String namesrv = args[0];
        final String topic = args[1];
        final int threads = Lat.intArg(args[2], "THREADS");
        final int count = Lat.intArg(args[3], "COUNT");
        final int size = Lat.intArg(args[4], "SIZE");
        if (threads < 1 || count < 1 || size < 1) {
            throw new IllegalArgumentException("THREADS, COUNT and SIZE must be >= 1");
        }
        final int timeoutMs = Integer.getInteger("peer.timeoutMs", 3000);
        final String tag = System.getProperty("peer.tag", "bench");
        final int batch = Integer.getInteger("peer.batch", 1);   // > 1: send(Collection) of that many messages

        final DefaultMQProducer producer =
            new DefaultMQProducer(System.getProperty("peer.group", "peer_remoting_producer"));
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(timeoutMs);
        producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        producer.start();

        final byte[] body = new byte[size];
        new Random(42).nextBytes(body);

        final int warmup = Integer.getInteger("peer.warmup", 0);   // untimed single sends first
        for (int i = 0; i < warmup; i++) {
            try {
                producer.send(new Message(topic, tag, body));
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
                        SendResult r;
                        if (batch > 1) {
                            java.util.List<Message> msgs = new java.util.ArrayList<>(batch);
                            for (int b = 0; b < batch; b++) {
                                msgs.add(new Message(topic, tag, body));
                            }
                            r = producer.send(msgs);
                        } else {
                            r = producer.send(new Message(topic, tag, body));
                        }
                        long dt = System.nanoTime() - t0;
                        if (r.getSendStatus() == SendStatus.SEND_OK) {
                            mine[k++] = dt;
                        } else if (errors.incrementAndGet() <= 5) {
                            System.err.println("send status " + r.getSendStatus());
                        }
                    } catch (Exception e) {
                        if (errors.incrementAndGet() <= 5) {
                            System.err.println("send failed: " + e);
                        }
                    }
                }
                done[id] = k;
            }, "rproduce-" + t);
            ts[t].start();
        }
        long start = System.nanoTime();
        go.countDown();
        for (Thread t : ts) {
            t.join();
        }
        long elapsed = System.nanoTime() - start;

        System.out.println(Lat.produceLine(Lat.mergeSorted(lat, done), elapsed, errors.get()));
        if (batch > 1) {
            long sends = 0;
            for (int d : done) {
                sends += d;
            }
            System.out.printf("batched: %d msgs in %.1f s: %.0f msgs/s (batches of %d)%n", sends * batch,
                elapsed / 1e9, sends * batch / (elapsed / 1e9), batch);
        }
        System.out.flush();
        producer.shutdown();
        System.exit(errors.get() > 0 ? 1 : 0);
    }
}
