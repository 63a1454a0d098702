package peer;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Drains a topic with the remoting protocol's DefaultLitePullConsumer (rocketmq-client 5.3.3): RocketMQ's
 * fastest consumer that is simple to drive (pulls of -Dpeer.batch messages per queue, prefetched by its own
 * threads, offsets committed in the background).
 *
 * <pre>
 * LitePull NAMESRV TOPIC GROUP COUNT
 *   a new GROUP reads from the first offset (CONSUME_FROM_FIRST_OFFSET) until COUNT messages were polled.
 * -Dpeer.batch=32 (pullBatchSize)   -Dpeer.idleSec=30 give up after this long without a message
 * Prints: consume: N msgs in T s: R msgs/s
 * </pre>
 *
 * The queues are assigned after the handshake (Lat.handshake), so nothing is prefetched before the clock.
 */
public final class LitePull {
    private LitePull() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: LitePull NAMESRV_ADDR TOPIC GROUP TOTAL_COUNT");
            System.exit(2);
        }
        final String topic = args[1];
        final long count = Lat.intArg(args[3], "COUNT");
        final int batch = Integer.getInteger("peer.batch", 32);
        final long idleNanos = Long.getLong("peer.idleSec", 30L) * 1_000_000_000L;

        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(args[2]);
        consumer.setNamesrvAddr(args[0]);
        consumer.setPullBatchSize(batch);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAutoCommit(true);
        consumer.start();
        Collection<MessageQueue> queues = consumer.fetchMessageQueues(topic);
        Lat.handshake();

        final long start = System.nanoTime();
        consumer.assign(new ArrayList<>(queues));
        long got = 0;
        long lastProgress = start;
        while (got < count) {
            List<MessageExt> polled = consumer.poll(1000);
            long now = System.nanoTime();
            if (polled.isEmpty()) {
                if (now - lastProgress > idleNanos) {
                    break;
                }
                continue;
            }
            got += polled.size();
            lastProgress = now;
        }
        long end = got >= count ? System.nanoTime() : lastProgress;
        double secs = (end - start) / 1e9;
        String line = String.format("consume: %d msgs in %.1f s: %.0f msgs/s", got, secs, secs > 0 ? got / secs : 0.0);
        System.out.println(got >= count ? line : line + " (INCOMPLETE)");
        System.out.flush();
        consumer.commitSync();  // what was polled counts as consumed: the broker keeps the offsets at shutdown
        consumer.shutdown();
        System.exit(got >= count ? 0 : 1);
    }
}
