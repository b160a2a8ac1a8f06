package dev.tollgate.client;

import java.util.Objects;
import java.util.function.Supplier;

/**
 * Where the bearer token of a user's request comes from: the host's verified credential for that
 * user, asked before every operation (a retry reuses the operation's token). The sidecar takes the
 * user from the token, never from anything else the client sends.
 *
 * <p>A function that throws, or answers {@code null} or a blank token, fails the operation with
 * {@link TollgateException.CredentialsUnavailable} and nothing is sent.
 */
@FunctionalInterface
public interface Credentials {

  /**
   * The bearer token to send for {@code userId}.
   *
   * @param userId the user named by {@link TollgateClient#forUser(String)}
   * @return the token (without the {@code Bearer } prefix)
   * @throws Exception when no token can be had; the operation fails without sending
   */
  String token(String userId) throws Exception;

  /**
   * The same token source for every user, such as a service's own token.
   *
   * @param token asked before every operation
   * @return the credentials
   */
  static Credentials fixed(Supplier<String> token) {
    Objects.requireNonNull(token, "token");
    return userId -> token.get();
  }
}
