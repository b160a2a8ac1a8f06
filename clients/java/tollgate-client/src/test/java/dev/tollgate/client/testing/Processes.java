package dev.tollgate.client.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/** Ports, processes and the repository the suite runs in. */
public final class Processes {
  private Processes() {}

  private static final java.util.Set<Process> STARTED = java.util.concurrent.ConcurrentHashMap.newKeySet();

  static {
    // Nothing outlives the test JVM, even a test that never closed what it started.
    Runtime.getRuntime().addShutdownHook(new Thread(() -> STARTED.forEach(Process::destroyForcibly)));
  }

  /** Starts {@code pb}, and kills the process when the JVM exits if it still runs then. */
  public static Process start(ProcessBuilder pb) throws IOException {
    Process p = pb.start();
    STARTED.add(p);
    p.onExit().thenRun(() -> STARTED.remove(p));
    return p;
  }

  /** Deletes a directory and everything in it, quietly. */
  public static void deleteTree(Path dir) {
    if (dir == null || !Files.exists(dir)) {
      return;
    }
    try (java.util.stream.Stream<Path> walk = Files.walk(dir)) {
      walk.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    } catch (IOException e) {
      // Left for the OS's temp cleaner.
    }
  }

  /** A port free on 127.0.0.1 now. */
  public static int freePort() {
    try (ServerSocket s = new ServerSocket()) {
      s.setReuseAddress(true);
      s.bind(new InetSocketAddress("127.0.0.1", 0));
      return s.getLocalPort();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Whether something accepts connections on 127.0.0.1:{@code port}. */
  public static boolean listening(int port) {
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress("127.0.0.1", port), 200);
      return true;
    } catch (IOException e) {
      return false;
    }
  }

  /** Stops a process: SIGTERM, then SIGKILL after 10 s. */
  public static void stop(Process p) {
    if (p == null || !p.isAlive()) {
      return;
    }
    p.destroy();
    try {
      if (!p.waitFor(10, TimeUnit.SECONDS)) {
        p.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      p.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }

  /** The repository's root: the nearest directory above this one with crates/tollgate-server. */
  public static Path repoRoot() {
    Path dir = Path.of(System.getProperty("user.dir")).toAbsolutePath();
    for (Path d = dir; d != null; d = d.getParent()) {
      if (Files.isDirectory(d.resolve("crates").resolve("tollgate-server"))
          && Files.isRegularFile(d.resolve("Cargo.toml"))) {
        return d;
      }
    }
    throw new IllegalStateException("not inside the tollgate repository: " + dir);
  }

  /** The last {@code max} characters of a file, for failure messages. */
  public static String tail(Path file, int max) {
    try {
      String s = Files.readString(file);
      return s.length() > max ? s.substring(s.length() - max) : s;
    } catch (IOException e) {
      return "(no log: " + e + ")";
    }
  }

  /** Waits until {@code condition} holds, polling, for at most {@code timeoutMs}. */
  public static boolean poll(long timeoutMs, java.util.function.BooleanSupplier condition) {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
    while (true) {
      if (condition.getAsBoolean()) {
        return true;
      }
      if (System.nanoTime() > deadline) {
        return false;
      }
      try {
        Thread.sleep(20);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    }
  }
}
