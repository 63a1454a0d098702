package peer;

import java.util.Arrays;

/** Shared helpers for the producers: latency percentiles and the one-line result. */
final class Lat {
    private Lat() {
    }

    /** Concatenates the first done[i] entries of each per-thread array and sorts them. */
    static long[] mergeSorted(long[][] perThread, int[] done) {
        int n = 0;
        for (int d : done) {
            n += d;
        }
        long[] all = new long[n];
        int at = 0;
        for (int t = 0; t < perThread.length; t++) {
            System.arraycopy(perThread[t], 0, all, at, done[t]);
            at += done[t];
        }
        Arrays.sort(all);
        return all;
    }

    /** Nearest-rank percentile of sorted nanosecond values, in milliseconds. */
    static double pctMs(long[] sortedNanos, double p) {
        if (sortedNanos.length == 0) {
            return 0.0;
        }
        int i = (int) Math.ceil(p / 100.0 * sortedNanos.length) - 1;
        i = Math.max(0, Math.min(i, sortedNanos.length - 1));
        return sortedNanos[i] / 1e6;
    }

    /** "produce: 20000 msgs in 3.2 s: 6250 msgs/s p50 0.61 ms p99 2.30 ms[, errors E]" */
    static String produceLine(long[] sortedNanos, long elapsedNanos, long errors) {
        double secs = elapsedNanos / 1e9;
        long n = sortedNanos.length;
        String line = String.format("produce: %d msgs in %.1f s: %.0f msgs/s p50 %.2f ms p99 %.2f ms",
            n, secs, secs > 0 ? n / secs : 0.0, pctMs(sortedNanos, 50), pctMs(sortedNanos, 99));
        return errors > 0 ? line + ", errors " + errors : line;
    }

    /**
     * With -Dpeer.handshake=true (how bench/peer_bench.py runs the programs): print "ready" once the client
     * is connected and warm, then wait for a line on stdin, so the caller reads the servers' CPU over the
     * measured load alone.
     */
    static void handshake() throws java.io.IOException {
        if (!Boolean.getBoolean("peer.handshake")) {
            return;
        }
        System.out.println("ready");
        System.out.flush();
        new java.io.BufferedReader(new java.io.InputStreamReader(System.in)).readLine();
    }

    static int intArg(String s, String name) {
        try {
            return Integer.parseInt(s.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be an integer, got '" + s + "'");
        }
    }
}
