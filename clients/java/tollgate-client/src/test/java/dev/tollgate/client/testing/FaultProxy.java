package dev.tollgate.client.testing;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;

/**
 * An HTTP proxy in front of a real sidecar that injects faults on the way, one scripted action per
 * request (then plain forwarding): answer without forwarding, forward and replace the answer (the
 * sidecar applied the request, the client sees a fault: a lost answer), or forward the body so
 * slowly that the sidecar itself answers 408. Every request it sees is recorded.
 */
public final class FaultProxy implements AutoCloseable {

  /** One request as the proxy saw it. */
  public record Seen(String method, String path, String body) {}

  /** A scripted answer. */
  public record Answer(int status, Map<String, String> headers, String body) {}

  private sealed interface Action permits Forward, Replace, Respond, Drip {}

  private record Forward() implements Action {}

  private record Replace(Answer answer) implements Action {}

  private record Respond(Answer answer) implements Action {}

  private record Drip() implements Action {}

  private final HttpServer server;
  private final URI upstream;
  private final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
  private final Deque<Action> script = new ArrayDeque<>();
  private final List<Seen> seen = Collections.synchronizedList(new ArrayList<>());

  private FaultProxy(URI upstream) throws IOException {
    this.upstream = upstream;
    this.server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 64);
    this.server.setExecutor(Executors.newCachedThreadPool());
    this.server.createContext("/", this::handle);
    this.server.start();
  }

  /** A proxy to {@code upstream} (a sidecar's URL). */
  public static FaultProxy to(String upstream) {
    try {
      return new FaultProxy(URI.create(upstream));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The proxy's URL, for the client. */
  public String url() {
    return "http://127.0.0.1:" + server.getAddress().getPort();
  }

  /** The next request is answered {@code answer} without reaching the sidecar. */
  public synchronized FaultProxy thenRespond(Answer answer) {
    script.add(new Respond(answer));
    return this;
  }

  /** The next request reaches the sidecar, which applies it, but the client gets {@code answer}. */
  public synchronized FaultProxy thenLoseAnswer(Answer answer) {
    script.add(new Replace(answer));
    return this;
  }

  /** The next request's body is sent to the sidecar in part and then stalls: the sidecar's 408. */
  public synchronized FaultProxy thenDripBody() {
    script.add(new Drip());
    return this;
  }

  /** The requests seen so far. */
  public List<Seen> seen() {
    synchronized (seen) {
      return List.copyOf(seen);
    }
  }

  /** The requests seen so far on {@code path}. */
  public List<Seen> seen(String path) {
    return seen().stream().filter(s -> s.path().startsWith(path)).toList();
  }

  private synchronized Action next() {
    Action a = script.poll();
    return a == null ? new Forward() : a;
  }

  private void handle(HttpExchange ex) throws IOException {
    try (ex) {
      byte[] body = ex.getRequestBody().readAllBytes();
      String target = ex.getRequestURI().getRawPath()
          + (ex.getRequestURI().getRawQuery() == null ? "" : "?" + ex.getRequestURI().getRawQuery());
      seen.add(new Seen(ex.getRequestMethod(), target, new String(body, StandardCharsets.UTF_8)));
      Action action = next();
      Answer answer;
      if (action instanceof Respond r) {
        answer = r.answer();
      } else if (action instanceof Drip) {
        answer = drip(ex, target, body);
      } else {
        Answer real = forward(ex, target, body);
        answer = action instanceof Replace r ? r.answer() : real;
      }
      byte[] out = answer.body().getBytes(StandardCharsets.UTF_8);
      answer.headers().forEach((k, v) -> ex.getResponseHeaders().add(k, v));
      ex.getResponseHeaders().set("content-type", "application/json");
      ex.sendResponseHeaders(answer.status(), out.length == 0 ? -1 : out.length);
      if (out.length > 0) {
        try (OutputStream os = ex.getResponseBody()) {
          os.write(out);
        }
      }
    }
  }

  private Answer forward(HttpExchange ex, String target, byte[] body) throws IOException {
    HttpRequest.Builder r =
        HttpRequest.newBuilder(upstream.resolve(target)).timeout(Duration.ofSeconds(60));
    for (String h : List.of("authorization", "content-type", "accept")) {
      String v = ex.getRequestHeaders().getFirst(h);
      if (v != null) {
        r.header(h, v);
      }
    }
    r.method(
        ex.getRequestMethod(),
        body.length == 0 ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofByteArray(body));
    try {
      HttpResponse<String> resp = http.send(r.build(), HttpResponse.BodyHandlers.ofString());
      Map<String, String> headers = new LinkedHashMap<>();
      for (String h : List.of("retry-after", "ratelimit-remaining", "ratelimit-reset")) {
        resp.headers().firstValue(h).ifPresent(v -> headers.put(h, v));
      }
      return new Answer(resp.statusCode(), headers, resp.body());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException(e);
    }
  }

  /** Sends the headers and half the body, then waits: the sidecar answers 408 and closes. */
  private Answer drip(HttpExchange ex, String target, byte[] body) throws IOException {
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress(upstream.getHost(), upstream.getPort()), 2000);
      s.setSoTimeout(60_000);
      StringBuilder head = new StringBuilder();
      head.append(ex.getRequestMethod()).append(' ').append(target).append(" HTTP/1.1\r\n");
      head.append("host: ").append(upstream.getHost()).append("\r\n");
      String auth = ex.getRequestHeaders().getFirst("authorization");
      if (auth != null) {
        head.append("authorization: ").append(auth).append("\r\n");
      }
      head.append("content-type: application/json\r\n");
      head.append("content-length: ").append(body.length).append("\r\n\r\n");
      OutputStream out = s.getOutputStream();
      out.write(head.toString().getBytes(StandardCharsets.US_ASCII));
      out.write(body, 0, body.length / 2);
      out.flush();
      InputStream in = s.getInputStream();
      ByteArrayOutputStream all = new ByteArrayOutputStream();
      byte[] buf = new byte[4096];
      int n;
      while ((n = in.read(buf)) != -1) {
        all.write(buf, 0, n);
        if (complete(all.toString(StandardCharsets.UTF_8))) {
          break;
        }
      }
      String resp = all.toString(StandardCharsets.UTF_8);
      int split = resp.indexOf("\r\n\r\n");
      String[] lines = resp.substring(0, split).split("\r\n");
      int status = Integer.parseInt(lines[0].split(" ")[1]);
      Map<String, String> headers = new LinkedHashMap<>();
      for (int i = 1; i < lines.length; i++) {
        int c = lines[i].indexOf(':');
        String k = lines[i].substring(0, c).trim().toLowerCase();
        if (k.equals("retry-after")) {
          headers.put(k, lines[i].substring(c + 1).trim());
        }
      }
      return new Answer(status, headers, resp.substring(split + 4));
    }
  }

  private static boolean complete(String resp) {
    int split = resp.indexOf("\r\n\r\n");
    if (split < 0) {
      return false;
    }
    for (String line : resp.substring(0, split).split("\r\n")) {
      if (line.toLowerCase().startsWith("content-length:")) {
        int len = Integer.parseInt(line.substring(15).trim());
        return resp.getBytes(StandardCharsets.UTF_8).length - split - 4 >= len;
      }
    }
    return false;
  }

  @Override
  public void close() {
    server.stop(0);
  }
}
