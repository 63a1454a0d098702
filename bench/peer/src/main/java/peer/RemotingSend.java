package peer;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * Sends numbered messages with the remoting protocol's DefaultMQProducer (rocketmq-client 5.3.3) and prints
 * what each send answered, so a test can find every message again (tests/test_rocketmq_store_compat.py).
 *
 * <pre>
 * RemotingSend NAMESRV TOPIC COUNT PREFIX
 *   message i: body PREFIX-i, tag PREFIX, keys "PREFIX-i PREFIX-key", user property idx=i
 * -Dpeer.delayLevel=N   a delay level (1 = 1 s ... 18 = 2 h) on every message
 * Prints one line a message: sent UNIQ_KEY QUEUE_ID QUEUE_OFFSET OFFSET_MSG_ID
 * </pre>
 */
public final class RemotingSend {
    private RemotingSend() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: RemotingSend NAMESRV_ADDR TOPIC COUNT PREFIX");
            System.exit(2);
        }
        final String topic = args[1];
        final int count = Lat.intArg(args[2], "COUNT");
        final String prefix = args[3];
        final int level = Integer.getInteger("peer.delayLevel", 0);
        DefaultMQProducer producer = new DefaultMQProducer(System.getProperty("peer.group", "peer_remoting_send"));
        producer.setNamesrvAddr(args[0]);
        producer.setSendMsgTimeout(10000);
        producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        producer.start();
        int failed = 0;
        try {
            for (int i = 0; i < count; i++) {
                Message msg = new Message(topic, prefix, (prefix + "-" + i).getBytes("UTF-8"));
                msg.setKeys(prefix + "-" + i + " " + prefix + "-key");
                msg.putUserProperty("idx", Integer.toString(i));
                if (level > 0) {
                    msg.setDelayTimeLevel(level);
                }
                SendResult r = producer.send(msg);
                if (r.getSendStatus() != SendStatus.SEND_OK) {
                    System.err.println("send " + i + ": " + r.getSendStatus());
                    failed++;
                }
                System.out.println("sent " + r.getMsgId() + " " + r.getMessageQueue().getQueueId() + " "
                    + r.getQueueOffset() + " " + r.getOffsetMsgId());
            }
        } finally {
            System.out.flush();
            producer.shutdown();
        }
        System.exit(failed == 0 ? 0 : 1);
    }
}
