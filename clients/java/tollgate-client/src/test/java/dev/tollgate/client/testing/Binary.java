package dev.tollgate.client.testing;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The {@code tollgate} binary the suite starts: {@code $TOLLGATE_BIN} (or the system property
 * {@code tollgate.bin}), else {@code target/debug/tollgate} of this repository, built with {@code
 * cargo build -p tollgate-server} when it is missing.
 */
public final class Binary {
  private Binary() {}

  private static Path path;

  /** The binary, built first if missing. */
  public static synchronized Path get() {
    if (path != null) {
      return path;
    }
    String named = System.getProperty("tollgate.bin", System.getenv("TOLLGATE_BIN"));
    Path root = Processes.repoRoot();
    Path p = named != null && !named.isBlank() ? Path.of(named) : root.resolve("target/debug/tollgate");
    if (!Files.isExecutable(p)) {
      build(root, p);
    }
    path = p;
    return p;
  }

  private static void build(Path root, Path p) {
    System.err.println("tollgate binary missing at " + p + ": cargo build -p tollgate-server");
    try {
      Process cargo =
          new ProcessBuilder("cargo", "build", "-p", "tollgate-server")
              .directory(root.toFile())
              .inheritIO()
              .start();
      int rc = cargo.waitFor();
      if (rc != 0) {
        throw new IllegalStateException("cargo build -p tollgate-server failed with exit code " + rc);
      }
    } catch (IOException e) {
      throw new IllegalStateException("cannot run cargo to build tollgate: " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
    if (!Files.isExecutable(p)) {
      throw new IllegalStateException("cargo built, but there is no binary at " + p);
    }
  }
}
