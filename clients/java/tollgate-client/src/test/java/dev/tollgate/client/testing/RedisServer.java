package dev.tollgate.client.testing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

/**
 * A {@code redis-server} of the suite's own, on a free port, keeping nothing on disk; never one
 * already running on the machine. Missing {@code redis-server} skips the test, or fails it when
 * {@code TOLLGATE_TEST_REQUIRE_REDIS} is set (as {@code ./scripts/test} does).
 */
public final class RedisServer implements AutoCloseable {
  private final int port;
  private final Path dir;
  private Process process;

  private RedisServer(int port, Path dir) {
    this.port = port;
    this.dir = dir;
  }

  /** Starts a server on a free port. */
  public static RedisServer start() {
    String exe = which("redis-server");
    if (exe == null) {
      if (System.getenv("TOLLGATE_TEST_REQUIRE_REDIS") != null) {
        Assertions.fail("redis-server is not installed (TOLLGATE_TEST_REQUIRE_REDIS is set)");
      }
      Assumptions.abort("redis-server is not installed");
    }
    try {
      RedisServer r = new RedisServer(Processes.freePort(), Files.createTempDirectory("tollgate-redis"));
      r.launch();
      return r;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static String which(String name) {
    for (String d : System.getenv().getOrDefault("PATH", "").split(":")) {
      Path p = Path.of(d, name);
      if (Files.isExecutable(p)) {
        return p.toString();
      }
    }
    return null;
  }

  private void launch() throws IOException {
    process =
        Processes.start(new ProcessBuilder(
                "redis-server",
                "--port", Integer.toString(port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", dir.toString())
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("redis.log").toFile()));
    boolean up =
        Processes.poll(
            10_000,
            () -> {
              try {
                return command("PING").equals("+PONG");
              } catch (UncheckedIOException e) {
                return false;
              }
            });
    if (!up) {
      Processes.stop(process);
      throw new IllegalStateException(
          "redis-server did not start on " + port + ": " + Processes.tail(dir.resolve("redis.log"), 2000));
    }
  }

  /** {@code redis://127.0.0.1:<port>}. */
  public String url() {
    return "redis://127.0.0.1:" + port;
  }

  /** Stops the server (its data is gone). */
  public void stop() {
    Processes.stop(process);
  }

  /** Starts it again on the same port, empty. */
  public void restart() {
    stop();
    try {
      launch();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Sends one command (RESP) and answers the reply's first line, e.g. {@code +OK} or {@code :1}. */
  public String command(String... args) {
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress("127.0.0.1", port), 500);
      s.setSoTimeout(2000);
      StringBuilder req = new StringBuilder("*" + args.length + "\r\n");
      for (String a : args) {
        byte[] b = a.getBytes(StandardCharsets.UTF_8);
        req.append('$').append(b.length).append("\r\n").append(a).append("\r\n");
      }
      OutputStream out = s.getOutputStream();
      out.write(req.toString().getBytes(StandardCharsets.UTF_8));
      out.flush();
      InputStream in = s.getInputStream();
      StringBuilder line = new StringBuilder();
      int c;
      while ((c = in.read()) != -1 && c != '\r') {
        line.append((char) c);
      }
      return line.toString();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public void close() {
    stop();
    Processes.deleteTree(dir);
  }
}
