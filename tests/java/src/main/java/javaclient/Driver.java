package javaclient;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.BufferedReader;
import java.io.Closeable;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.ProducerBuilder;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
import org.apache.rocketmq.client.java.impl.consumer.PushSubscriptionSettings;
import org.apache.rocketmq.client.java.retry.RetryPolicy;

/**
 * Runs the official RocketMQ 5 Java client for tests/test_java_client.py: one JSON command per line on stdin,
 * one JSON answer per line on stdout ({"ok": true, "result": ...} or {"ok": false, "error": "the stack trace",
 * "causes": ["SimpleClassName: message" of the exception and of each of its causes]}).
 * The client's own chatter goes to stderr, so stdout carries answers only.
 *
 * <p>Clients that outlive a command (consumers, a transactional producer waiting for its checks) are kept
 * by the name the command gives them and closed by {"op": "close", "name": ...}.
 */
public final class Driver {
    private static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();
    private static final long CLOSE_WAIT_MS = 30_000; // for the background closes, once stdin has ended
    private static final Gson GSON = new GsonBuilder().serializeNulls().create();
    private final Map<String, Closeable> clients = new HashMap<>();
    private final Map<String, Recorder> recorders = new HashMap<>();
    private final List<Thread> closings = new ArrayList<>();

    private Driver() {
    }

    public static void main(String[] args) throws Exception {
        PrintStream answers = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        Driver driver = new Driver();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            JsonObject answer = new JsonObject();
            try {
                answer.add("result", driver.run(JsonParser.parseString(line).getAsJsonObject()));
                answer.addProperty("ok", true);
            } catch (Throwable e) {
                StringWriter trace = new StringWriter();
                e.printStackTrace(new PrintWriter(trace));
                answer.addProperty("ok", false);
                answer.addProperty("error", trace.toString());
                JsonArray causes = new JsonArray();
                for (Throwable c = e; c != null; c = c.getCause()) {
                    causes.add(c.getClass().getSimpleName() + ": " + c.getMessage());
                }
                answer.add("causes", causes);
            }
            answers.println(GSON.toJson(answer));
        }
        driver.closeAll();
        System.exit(0); // the client's non-daemon threads would keep the JVM alive
    }

    private JsonElement run(JsonObject cmd) throws Exception {
        String op = cmd.get("op").getAsString();
        switch (op) {
            case "send":
                return send(cmd);
            case "transaction":
                return transaction(cmd);
            case "simple_open":
                return simpleOpen(cmd);
            case "simple_receive":
                return simpleReceive(cmd);
            case "push_open":
                return pushOpen(cmd);
            case "recorded":
                return recorded(cmd);
            case "push_settings":
                return pushSettings(cmd);
            case "close":
                return close(cmd.get("name").getAsString());
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    /**
     * The one place a client learns where the broker is, whether to speak TLS ("ssl"; absent: the client's
     * default, TLS) and whose credentials to sign its calls with ("ak", "sk"; absent: none).
     */
    private static ClientConfiguration configuration(JsonObject cmd) {
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder()
            .setEndpoints(cmd.get("endpoint").getAsString())
            .setRequestTimeout(Duration.ofSeconds(10));
        if (cmd.has("ssl")) {
            builder.enableSsl(cmd.get("ssl").getAsBoolean());
        }
        if (cmd.has("ak")) {
            builder.setCredentialProvider(
                new StaticSessionCredentialsProvider(cmd.get("ak").getAsString(), cmd.get("sk").getAsString()));
        }
        return builder.build();
    }

    // --- producing ---------------------------------------------------------------------------------

    private static Message message(JsonObject m, String topic) {
        MessageBuilder b = PROVIDER.newMessageBuilder().setTopic(topic)
            .setBody(m.get("body").getAsString().getBytes(StandardCharsets.UTF_8));
        if (m.has("tag")) {
            b.setTag(m.get("tag").getAsString());
        }
        if (m.has("keys")) {
            List<String> keys = new ArrayList<>();
            m.getAsJsonArray("keys").forEach(k -> keys.add(k.getAsString()));
            b.setKeys(keys.toArray(new String[0]));
        }
        if (m.has("group")) {
            b.setMessageGroup(m.get("group").getAsString());
        }
        if (m.has("delay_ms")) {
            b.setDeliveryTimestamp(System.currentTimeMillis() + m.get("delay_ms").getAsLong());
        }
        if (m.has("properties")) {
            for (Map.Entry<String, JsonElement> p : m.getAsJsonObject("properties").entrySet()) {
                b.addProperty(p.getKey(), p.getValue().getAsString());
            }
        }
        return b.build();
    }

    private static JsonObject receipt(SendReceipt r, long sentAtMs) {
        JsonObject o = new JsonObject();
        o.addProperty("message_id", r.getMessageId().toString());
        o.addProperty("sent_at_ms", sentAtMs);
        return o;
    }

    /** {endpoint, ssl?, ak?, sk?, topic, messages: [{body, tag?, keys?, group?, delay_ms?, properties?}]}: sent in order. */
    private static JsonElement send(JsonObject cmd) throws Exception {
        String topic = cmd.get("topic").getAsString();
        JsonArray receipts = new JsonArray();
        try (Producer producer = PROVIDER.newProducerBuilder().setClientConfiguration(configuration(cmd))
            .setTopics(topic).build()) {
            for (JsonElement m : cmd.getAsJsonArray("messages")) {
                long at = System.currentTimeMillis();
                receipts.add(receipt(producer.send(message(m.getAsJsonObject(), topic)), at));
            }
        }
        return receipts;
    }

    /**
     * {name, endpoint, ssl, topic, messages: [{body, end: commit|rollback|none, check?: COMMIT|ROLLBACK}]}:
     * each message in a transaction of its own, ended as told; "none" leaves it open for the broker to
     * check, which the producer's checker answers with the message's "check". The producer stays open
     * (under name) for those checks; {op: close} shows what was checked.
     */
    private JsonElement transaction(JsonObject cmd) throws Exception {
        String topic = cmd.get("topic").getAsString();
        Map<String, String> answers = new ConcurrentHashMap<>();
        Recorder checked = new Recorder();
        ProducerBuilder builder = PROVIDER.newProducerBuilder().setClientConfiguration(configuration(cmd))
            .setTopics(topic).setTransactionChecker(view -> {
                String body = StandardCharsets.UTF_8.decode(view.getBody().duplicate()).toString();
                checked.add(describe(view, null));
                return TransactionResolution.valueOf(answers.getOrDefault(body, "UNKNOWN"));
            });
        Producer producer = builder.build();
        String name = cmd.get("name").getAsString();
        clients.put(name, producer);
        recorders.put(name, checked);
        JsonArray receipts = new JsonArray();
        for (JsonElement e : cmd.getAsJsonArray("messages")) {
            JsonObject m = e.getAsJsonObject();
            if (m.has("check")) {
                answers.put(m.get("body").getAsString(), m.get("check").getAsString());
            }
            Transaction tx = producer.beginTransaction();
            long at = System.currentTimeMillis();
            receipts.add(receipt(producer.send(message(m, topic), tx), at));
            switch (m.get("end").getAsString()) {
                case "commit":
                    tx.commit();
                    break;
                case "rollback":
                    tx.rollback();
                    break;
                default:
                    break;
            }
        }
        return receipts;
    }

    // --- consuming ---------------------------------------------------------------------------------

    private static Map<String, FilterExpression> subscriptions(JsonObject cmd) {
        Map<String, FilterExpression> subs = new LinkedHashMap<>();
        for (Map.Entry<String, JsonElement> s : cmd.getAsJsonObject("subscriptions").entrySet()) {
            subs.put(s.getKey(), new FilterExpression(s.getValue().getAsString(), FilterExpressionType.TAG));
        }
        return subs;
    }

    private static JsonObject describe(MessageView v, String thread) {
        JsonObject o = new JsonObject();
        o.addProperty("message_id", v.getMessageId().toString());
        o.addProperty("topic", v.getTopic());
        o.addProperty("body", StandardCharsets.UTF_8.decode(v.getBody().duplicate()).toString());
        o.addProperty("tag", v.getTag().orElse(null));
        JsonArray keys = new JsonArray();
        v.getKeys().forEach(keys::add);
        o.add("keys", keys);
        o.addProperty("group", v.getMessageGroup().orElse(null));
        o.addProperty("attempt", v.getDeliveryAttempt());
        v.getDeliveryTimestamp().ifPresent(t -> o.addProperty("delivery_timestamp_ms", t));
        o.addProperty("born_timestamp_ms", v.getBornTimestamp());
        o.add("properties", GSON.toJsonTree(v.getProperties()));
        o.addProperty("received_at_ms", System.currentTimeMillis());
        if (thread != null) {
            o.addProperty("thread", thread);
        }
        return o;
    }

    /** {name, endpoint, ssl, group, subscriptions: {topic: tag expression}, await_s}. */
    private JsonElement simpleOpen(JsonObject cmd) throws Exception {
        SimpleConsumer consumer = PROVIDER.newSimpleConsumerBuilder().setClientConfiguration(configuration(cmd))
            .setConsumerGroup(cmd.get("group").getAsString())
            .setSubscriptionExpressions(subscriptions(cmd))
            .setAwaitDuration(Duration.ofSeconds(cmd.get("await_s").getAsLong()))
            .build();
        clients.put(cmd.get("name").getAsString(), consumer);
        return new JsonObject();
    }

    /**
     * {name, max, invisible_s, then: ack|none|invisible:SECONDS}: one receive (long-polling up to await_s),
     * and what is done to every message received.
     */
    private JsonElement simpleReceive(JsonObject cmd) throws Exception {
        SimpleConsumer consumer = (SimpleConsumer) clients.get(cmd.get("name").getAsString());
        List<MessageView> got = consumer.receive(cmd.get("max").getAsInt(),
            Duration.ofSeconds(cmd.get("invisible_s").getAsLong()));
        String then = cmd.get("then").getAsString();
        JsonArray out = new JsonArray();
        for (MessageView v : got) {
            out.add(describe(v, null));
            if (then.equals("ack")) {
                consumer.ack(v);
            } else if (then.startsWith("invisible:")) {
                consumer.changeInvisibleDuration(v, Duration.ofSeconds(Long.parseLong(then.substring(10))));
            } else if (!then.equals("none")) {
                throw new IllegalArgumentException("then: ack, none or invisible:SECONDS, not " + then);
            }
        }
        return out;
    }

    /**
     * {name, endpoint, ssl, group, subscriptions, threads, fail: {body: attempts}}: a PushConsumer whose
     * listener records every delivery and answers FAILURE for a message listed in fail while its delivery
     * attempt is at most that number (SUCCESS otherwise).
     */
    private JsonElement pushOpen(JsonObject cmd) throws Exception {
        Map<String, Integer> fail = new HashMap<>();
        if (cmd.has("fail")) {
            cmd.getAsJsonObject("fail").entrySet().forEach(e -> fail.put(e.getKey(), e.getValue().getAsInt()));
        }
        Recorder recorder = new Recorder();
        PushConsumer consumer = PROVIDER.newPushConsumerBuilder().setClientConfiguration(configuration(cmd))
            .setConsumerGroup(cmd.get("group").getAsString())
            .setSubscriptionExpressions(subscriptions(cmd))
            .setConsumptionThreadCount(cmd.get("threads").getAsInt())
            .setMessageListener(view -> {
                JsonObject seen = describe(view, Thread.currentThread().getName());
                recorder.begin(seen);
                Integer failUpTo = fail.get(seen.get("body").getAsString());
                boolean failed = failUpTo != null && view.getDeliveryAttempt() <= failUpTo;
                seen.addProperty("result", failed ? "FAILURE" : "SUCCESS");
                recorder.end(seen);
                return failed ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
            })
            .build();
        String name = cmd.get("name").getAsString();
        clients.put(name, consumer);
        recorders.put(name, recorder);
        return new JsonObject();
    }

    /** {name, count, timeout_s}: what the named client recorded so far (deliveries, checks), once there are count
     * records or timeout_s passed. */
    private JsonElement recorded(JsonObject cmd) throws InterruptedException {
        Recorder recorder = recorders.get(cmd.get("name").getAsString());
        return recorder.await(cmd.get("count").getAsInt(), cmd.get("timeout_s").getAsLong() * 1000);
    }

    /**
     * {name}: the settings the PushConsumer adopted from the broker's Telemetry answer (fifo, retry policy),
     * read from its implementation class, which is not public API.
     */
    private JsonElement pushSettings(JsonObject cmd) throws ReflectiveOperationException {
        Object consumer = clients.get(cmd.get("name").getAsString());
        Method getSettings = consumer.getClass().getMethod("getSettings");
        Method getRetryPolicy = consumer.getClass().getMethod("getRetryPolicy");
        getSettings.setAccessible(true);
        getRetryPolicy.setAccessible(true);
        PushSubscriptionSettings settings = (PushSubscriptionSettings) getSettings.invoke(consumer);
        RetryPolicy policy = (RetryPolicy) getRetryPolicy.invoke(consumer);
        JsonObject o = new JsonObject();
        o.addProperty("fifo", settings.isFifo());
        o.addProperty("max_attempts", policy.getMaxAttempts());
        JsonArray delays = new JsonArray();
        for (int attempt = 1; attempt <= 3; attempt++) {
            delays.add(policy.getNextAttemptDelay(attempt).toMillis());
        }
        o.add("next_attempt_delays_ms", delays);
        return o;
    }

    /**
     * {name}: closes the client and answers what it recorded. A PushConsumer's close waits for its long-polling
     * receives (up to the broker's long-polling timeout, 20 s), so it goes on in the background; the answer is
     * what it had consumed when asked.
     */
    private JsonElement close(String name) throws Exception {
        Closeable client = clients.remove(name);
        if (client == null) {
            throw new IllegalArgumentException("no client named " + name);
        }
        Recorder recorder = recorders.remove(name);
        JsonArray recorded = recorder == null ? new JsonArray() : recorder.await(0, 0);
        if (client instanceof PushConsumer) {
            Thread closing = new Thread(() -> closeQuietly(name, client), "close-" + name);
            closing.start();
            closings.add(closing);
        } else {
            client.close();
        }
        return recorded;
    }

    private static void closeQuietly(String name, Closeable client) {
        try {
            client.close();
        } catch (Exception e) {
            System.err.println("closing " + name + " failed:");
            e.printStackTrace();
        }
    }

    private void closeAll() throws InterruptedException {
        for (String name : Set.copyOf(clients.keySet())) {
            closeQuietly(name, clients.remove(name));
        }
        long deadline = System.currentTimeMillis() + CLOSE_WAIT_MS;
        for (Thread closing : closings) {
            closing.join(Math.max(1, deadline - System.currentTimeMillis()));
        }
    }

    /** Deliveries in the order the listener saw them; "overlap" marks one that began while another of the same
     * message group was still being consumed. */
    private static final class Recorder {
        private final List<JsonObject> seen = new ArrayList<>();
        private final Map<String, Integer> busyGroups = new HashMap<>();

        synchronized void add(JsonObject o) {
            seen.add(o);
            notifyAll();
        }

        synchronized void begin(JsonObject o) {
            String group = o.has("group") && !o.get("group").isJsonNull() ? o.get("group").getAsString() : null;
            if (group != null) {
                int busy = busyGroups.merge(group, 1, Integer::sum);
                o.addProperty("overlap", busy > 1);
            }
            seen.add(o);
        }

        synchronized void end(JsonObject o) {
            if (o.has("group") && !o.get("group").isJsonNull()) {
                busyGroups.merge(o.get("group").getAsString(), -1, Integer::sum);
            }
            notifyAll();
        }

        synchronized JsonArray await(int count, long timeoutMs) throws InterruptedException {
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (seen.size() < count) {
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) {
                    break;
                }
                wait(left);
            }
            JsonArray out = new JsonArray();
            seen.forEach(o -> out.add(o.deepCopy()));
            return out;
        }
    }
}
