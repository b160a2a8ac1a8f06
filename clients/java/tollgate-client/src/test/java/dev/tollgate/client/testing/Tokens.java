package dev.tollgate.client.testing;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/** HS256 tokens for the test sidecars' {@code [identity]} (mode jwt), minted here. */
public final class Tokens {
  private Tokens() {}

  /** The test sidecars' HS256 secret. */
  public static final String SECRET = "tollgate-java-test-secret-0123456789abcdef";
  /** The issuer the sidecars expect. */
  public static final String ISSUER = "https://issuer.test";
  /** The audience the sidecars expect. */
  public static final String AUDIENCE = "tollgate-test";
  /** The sidecars' admin token. */
  public static final String ADMIN = "admin-token-0123456789abcdef";
  /** The scope that may report provider answers. */
  public static final String FEEDBACK_SCOPE = "tollgate:feedback";

  private static final ObjectMapper JSON = new ObjectMapper();

  /** A token for {@code user} valid for an hour. */
  public static String token(String user) {
    return token(user, null);
  }

  /** A token for {@code user} with {@code scope} (space-separated), valid for an hour. */
  public static String token(String user, String scope) {
    long now = System.currentTimeMillis() / 1000;
    ObjectNode claims =
        JSON.createObjectNode()
            .put("sub", user)
            .put("iss", ISSUER)
            .put("aud", AUDIENCE)
            .put("iat", now)
            .put("exp", now + 3600);
    if (scope != null) {
      claims.put("scope", scope);
    }
    try {
      String signing =
          b64(JSON.writeValueAsBytes(JSON.createObjectNode().put("alg", "HS256").put("typ", "JWT")))
              + "."
              + b64(JSON.writeValueAsBytes(claims));
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(SECRET.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
      return signing + "." + b64(mac.doFinal(signing.getBytes(StandardCharsets.US_ASCII)));
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  private static String b64(byte[] b) {
    return Base64.getUrlEncoder().withoutPadding().encodeToString(b);
  }
}
