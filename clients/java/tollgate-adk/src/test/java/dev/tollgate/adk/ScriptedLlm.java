package dev.tollgate.adk;

import com.google.adk.models.BaseLlm;
import com.google.adk.models.BaseLlmConnection;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import com.google.genai.types.Content;
import com.google.genai.types.FunctionCall;
import com.google.genai.types.GenerateContentResponseUsageMetadata;
import com.google.genai.types.Part;
import io.reactivex.rxjava3.core.Flowable;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiFunction;

/**
 * A model for real ADK runs whose answers the test scripts: given the request and the call's
 * number (from 0, across the model's life), the responses to stream.
 */
final class ScriptedLlm extends BaseLlm {
  final AtomicInteger calls = new AtomicInteger();
  private final BiFunction<LlmRequest, Integer, Flowable<LlmResponse>> script;

  ScriptedLlm(BiFunction<LlmRequest, Integer, Flowable<LlmResponse>> script) {
    super("scripted");
    this.script = script;
  }

  /** Answers every call with {@code text} and {@code tokens} of usage (prompt 80 %, rest output). */
  static ScriptedLlm answering(String text, int tokens) {
    return new ScriptedLlm((req, n) -> Flowable.just(text(text, tokens)));
  }

  @Override
  public Flowable<LlmResponse> generateContent(LlmRequest request, boolean stream) {
    int n = calls.getAndIncrement();
    return Flowable.defer(() -> script.apply(request, n));
  }

  @Override
  public BaseLlmConnection connect(LlmRequest request) {
    throw new UnsupportedOperationException("live connections are not scripted");
  }

  static GenerateContentResponseUsageMetadata usage(int tokens) {
    int prompt = tokens * 4 / 5;
    return GenerateContentResponseUsageMetadata.builder()
        .promptTokenCount(prompt)
        .candidatesTokenCount(tokens - prompt)
        .totalTokenCount(tokens)
        .build();
  }

  static LlmResponse text(String text, int tokens) {
    return LlmResponse.builder()
        .content(Content.builder().role("model").parts(List.of(Part.fromText(text))).build())
        .usageMetadata(usage(tokens))
        .build();
  }

  static LlmResponse partial(String text, Integer tokens) {
    LlmResponse.Builder b =
        LlmResponse.builder()
            .content(Content.builder().role("model").parts(List.of(Part.fromText(text))).build())
            .partial(true);
    if (tokens != null) {
      b.usageMetadata(usage(tokens));
    }
    return b.build();
  }

  static LlmResponse call(String function, int tokens) {
    Part p = Part.builder().functionCall(FunctionCall.builder().name(function).args(Map.of()).build()).build();
    return LlmResponse.builder()
        .content(Content.builder().role("model").parts(List.of(p)).build())
        .usageMetadata(usage(tokens))
        .build();
  }
}
