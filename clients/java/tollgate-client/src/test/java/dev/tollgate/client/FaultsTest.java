package dev.tollgate.client;

import static dev.tollgate.client.ClientContract.granted;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.tollgate.client.testing.FaultProxy;
import dev.tollgate.client.testing.Processes;
import dev.tollgate.client.testing.RedisServer;
import dev.tollgate.client.testing.Sidecar;
import dev.tollgate.client.testing.Tokens;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * Faults from real processes: a Redis stopped under {@code fail_closed} and {@code fail_open}, a
 * memory store at its bound, a replica over its in-flight cap, a body the sidecar times out, a
 * script failing on a key of the wrong type, a port nobody listens on, a server that never
 * answers, and the client's own bounded pool.
 */
class FaultsTest {

  @Test
  void aStoppedRedisUnderFailClosedIsStoreUnavailable() {
    try (RedisServer redis = RedisServer.start();
        Sidecar sc = Sidecar.start("", Sidecar.redisStore(redis, "fail_closed"))) {
      TollgateClient c = Sidecar.client(sc.url(), Sidecar.fastRetries(1));
      granted(c.blocking().forUser("ola").admitRun("r"));
      assertTrue(c.blocking().readyz());
      redis.stop();
      TollgateException.StoreUnavailable e = assertThrows(TollgateException.StoreUnavailable.class,
          () -> c.blocking().forUser("ola").admitRun("r2"));
      assertEquals(503, e.status().getAsInt());
      assertEquals("store_unavailable", e.error());
      assertEquals("admit_run", e.operation());
      TollgateException.StoreUnavailable notReady = assertThrows(TollgateException.StoreUnavailable.class,
          () -> c.blocking().readyz());
      assertEquals("readyz", notReady.operation());
      redis.restart();
      assertTrue(Processes.poll(15_000, () -> {
        try {
          return c.blocking().readyz();
        } catch (TollgateException.StoreUnavailable down) {
          return false;
        }
      }), "ready again once Redis answers");
    }
  }

  @Test
  void closesWhileRedisIsDownUnderFailOpenArePendingAndDone() {
    try (RedisServer redis = RedisServer.start();
        Sidecar sc = Sidecar.start("", Sidecar.redisStore(redis, "fail_open"))) {
      TollgateClient c = Sidecar.client(sc.url(), Sidecar.fastRetries(1));
      UserClient.Blocking pat = c.blocking().forUser("pat");
      granted(pat.admitRun("r"));
      Reservation r = granted(pat.reserve("r", 1_000));
      Reservation r2 = granted(pat.reserve("r", 500));
      redis.stop();
      Closed settled = granted(pat.settle(r.reservationId(), 800));
      assertEquals(new Closed(OptionalLong.empty(), true), settled);
      assertTrue(settled.done());
      Closed refunded = granted(pat.refund(r2.reservationId()));
      assertTrue(refunded.pending() && refunded.done());
      Released released = pat.releaseRun("r");
      assertTrue(released.pending() && released.done(), released.toString());
    }
  }

  @Test
  void aFullMemoryStoreIsStoreFull() {
    try (Sidecar sc = Sidecar.start("", "[store]\nkind = \"memory\"\nmax_entries = 3\n")) {
      TollgateClient c = Sidecar.client(sc.url(), RetryPolicy.none());
      List<String> admitted = new ArrayList<>();
      TollgateException.StoreUnavailable full = null;
      for (int i = 0; i < 10 && full == null; i++) {
        try {
          granted(c.blocking().forUser("u" + i).admitRun("r"));
          admitted.add("u" + i);
        } catch (TollgateException.StoreUnavailable e) {
          full = e;
        }
      }
      assertTrue(full != null, "no store_full after " + admitted);
      assertEquals("store_full", full.error());
      assertEquals(OptionalLong.of(1_000), full.retryAfterMs());
      // Users already held keep working.
      granted(c.blocking().forUser(admitted.get(0)).renewRun("r"));
    }
  }

  @Test
  void aReplicaOverItsInFlightCapIsOverloaded() {
    try (Sidecar sc = Sidecar.start("max_in_flight = 1",
            "[limits]\nmax_waiting = 1\nmax_waits_per_user = 1\n");
        FaultProxy proxy = FaultProxy.to(sc.url())) {
      // The one slot is held by a wait=true reserve waiting about 3 s.
      TollgateClient direct = Sidecar.client(sc.url(), RetryPolicy.none());
      UserClient w = direct.forUser("waiter");
      granted(w.admitRun("r").join());
      granted(w.reserve("r", 1_000).join());
      CompletableFuture<Outcome<Reservation>> holding = w.reserve(Reserve.of("r", 3_000).waiting(5_000));
      assertTrue(Processes.poll(10_000,
          () -> direct.admin().user("waiter").join().tokensAvailable() < -1_000));
      // The sidecar's 429 overloaded, retried once after its 1 s hint, then raised.
      TollgateClient c = Sidecar.client(proxy.url(), new RetryPolicy(1, Duration.ofMillis(10), Duration.ofMillis(10), Duration.ofSeconds(2)));
      TollgateException.Overloaded o = assertThrows(TollgateException.Overloaded.class,
          () -> c.blocking().forUser("quin").admitRun("r"));
      assertEquals(429, o.status().getAsInt());
      assertEquals(OptionalLong.of(1_000), o.retryAfterMs());
      assertEquals(2, proxy.seen("/v1/runs").size());
      granted(holding.join());
      // The slot is free again.
      granted(c.blocking().forUser("quin").admitRun("r"));
    }
  }

  @Test
  void aBodyTheSidecarTimesOutIsRequestTimeout() {
    try (Sidecar sc = Sidecar.start("", "[limits]\nbody_timeout_ms = 300\n");
        FaultProxy proxy = FaultProxy.to(sc.url())) {
      proxy.thenDripBody();
      TollgateClient c = Sidecar.client(proxy.url(), RetryPolicy.none());
      TollgateException.RequestTimeout t = assertThrows(TollgateException.RequestTimeout.class,
          () -> c.blocking().forUser("rex").admitRun("r"));
      assertEquals(408, t.status().getAsInt());
      assertEquals("request_timeout", t.error());
    }
  }

  @Test
  void aFailingScriptIsAServerError() {
    try (RedisServer redis = RedisServer.start();
        Sidecar sc = Sidecar.start("", Sidecar.redisStore(redis, "fail_closed", "jbroken"))) {
      // The user's turn bucket is a string; a hash there makes the script fail.
      assertEquals(":1", redis.command("HSET", "jbroken:turn2:{sue}", "f", "v"));
      TollgateClient c = Sidecar.client(sc.url(), Sidecar.fastRetries(2));
      TollgateException.ServerError e = assertThrows(TollgateException.ServerError.class,
          () -> c.blocking().forUser("sue").admitRun("r"));
      assertEquals(500, e.status().getAsInt());
      assertEquals("internal", e.error());
    }
  }

  @Test
  void aConfigTheSidecarRefusesToReloadIsInvalidRequest() throws IOException {
    try (Sidecar sc = Sidecar.start("")) {
      AdminClient.Blocking admin = Sidecar.client(sc.url(), Sidecar.fastRetries(2)).blocking().admin();
      assertTrue(admin.reload().reloaded());
      Files.writeString(sc.config(),
          Files.readString(sc.config()).replace("default_plan = \"std\"", "default_plan = \"nope\""));
      TollgateException.InvalidRequest e = assertThrows(TollgateException.InvalidRequest.class, admin::reload);
      assertEquals("invalid_config", e.error());
      assertEquals("admin_reload", e.operation());
      assertTrue(e.getMessage().contains("nope") || e.getMessage().contains("default_plan"), e.getMessage());
      // The old config keeps serving.
      assertEquals("std", admin.user("someone").plan());
    }
  }

  @Test
  void noSidecarIsUnreachable() {
    int port = Processes.freePort();
    TollgateClient c = Sidecar.client("http://127.0.0.1:" + port, Sidecar.fastRetries(2));
    TollgateException.SidecarUnreachable e = assertThrows(TollgateException.SidecarUnreachable.class,
        () -> c.blocking().forUser("tom").admitRun("r"));
    assertEquals("unreachable", e.error());
    assertEquals("admit_run", e.operation());
    assertTrue(e.status().isEmpty());
    assertInstanceOf(IOException.class, e.getCause());
  }

  /** Accepts connections and never answers; counts them, and the most open at once. */
  static final class Silent implements AutoCloseable {
    final ServerSocket server;
    final AtomicInteger accepted = new AtomicInteger();
    final AtomicInteger open = new AtomicInteger();
    final AtomicInteger maxOpen = new AtomicInteger();

    Silent() throws IOException {
      server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
      Thread t = new Thread(this::accept, "silent-accept");
      t.setDaemon(true);
      t.start();
    }

    String url() {
      return "http://127.0.0.1:" + server.getLocalPort();
    }

    private void accept() {
      while (!server.isClosed()) {
        try {
          Socket s = server.accept();
          accepted.incrementAndGet();
          maxOpen.accumulateAndGet(open.incrementAndGet(), Math::max);
          Thread r = new Thread(() -> drain(s), "silent-read");
          r.setDaemon(true);
          r.start();
        } catch (IOException e) {
          return;
        }
      }
    }

    private void drain(Socket s) {
      try (s; InputStream in = s.getInputStream()) {
        byte[] buf = new byte[1024];
        while (in.read(buf) != -1) {
          // Read and never answer.
        }
      } catch (IOException e) {
        // Closed.
      } finally {
        open.decrementAndGet();
      }
    }

    @Override
    public void close() throws IOException {
      server.close();
    }
  }

  @Test
  void noAnswerWithinTheTimeoutIsATimeout() throws Exception {
    try (Silent silent = new Silent()) {
      TollgateClient c = TollgateClient.builder(silent.url())
          .credentials(Tokens::token)
          .timeout(Duration.ofMillis(300))
          .build();
      long t0 = System.nanoTime();
      TollgateException.SidecarUnreachable e = assertThrows(TollgateException.SidecarUnreachable.class,
          () -> c.blocking().forUser("uma").admitRun("r"));
      long took = (System.nanoTime() - t0) / 1_000_000;
      assertEquals("timeout", e.error());
      assertTrue(took >= 300 && took < 5_000, "took " + took + " ms");
    }
  }

  @Test
  void theConnectionPoolIsBounded() throws Exception {
    try (Silent silent = new Silent()) {
      TollgateClient c = TollgateClient.builder(silent.url())
          .credentials(Tokens::token)
          .timeout(Duration.ofSeconds(3))
          .maxConnections(2)
          .build();
      List<CompletableFuture<Outcome<Admitted>>> calls = new ArrayList<>();
      for (int i = 0; i < 6; i++) {
        calls.add(c.forUser("vic").admitRun("r" + i));
      }
      // Two connections opened; the other four requests wait for one, holding none.
      assertTrue(Processes.poll(2_500, () -> silent.accepted.get() == 2), "accepted " + silent.accepted.get());
      assertTrue(calls.stream().noneMatch(CompletableFuture::isDone));
      assertEquals(2, silent.accepted.get());
      assertEquals(2, silent.open.get());
      for (CompletableFuture<Outcome<Admitted>> f : calls) {
        CompletionException e = assertThrows(CompletionException.class, f::join);
        TollgateException.SidecarUnreachable u = assertInstanceOf(TollgateException.SidecarUnreachable.class, e.getCause());
        assertEquals("timeout", u.error());
      }
    }
  }

  @Test
  void aWaitingReserveHasItsWaitAddedToTheTimeout() {
    try (Sidecar sc = Sidecar.start("")) {
      TollgateClient c = TollgateClient.builder(sc.url())
          .credentials(Tokens::token)
          .timeout(Duration.ofMillis(500))
          .build();
      UserClient.Blocking w = c.blocking().forUser("waiter3");
      granted(w.admitRun("r"));
      granted(w.reserve("r", 1_000));
      long t0 = System.nanoTime();
      Reservation r = granted(w.reserve(Reserve.of("r", 1_500).waiting(5_000)));
      long took = (System.nanoTime() - t0) / 1_000_000;
      assertEquals(0, r.waitMs());
      assertTrue(took >= 1_000, "the sidecar waited about 1.5 s: " + took + " ms");
      // Without the wait, the same timeout is a timeout.
      TollgateException.SidecarUnreachable e = assertThrows(TollgateException.SidecarUnreachable.class,
          () -> w.reserve(new Reserve("r", 2_500, true, 0, java.util.Optional.empty(), java.util.Optional.empty(), TokenSplit.NONE)));
      assertEquals("timeout", e.error());
    }
  }
}
