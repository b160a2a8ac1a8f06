package dev.tollgate.adk;

import com.google.adk.agents.BaseAgent;
import com.google.adk.agents.LlmAgent;
import com.google.adk.artifacts.InMemoryArtifactService;
import com.google.adk.events.Event;
import com.google.adk.plugins.Plugin;
import com.google.adk.runner.Runner;
import com.google.adk.sessions.BaseSessionService;
import com.google.adk.sessions.InMemorySessionService;
import com.google.adk.models.BaseLlm;
import com.google.genai.types.Content;
import com.google.genai.types.Part;
import io.reactivex.rxjava3.core.Flowable;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

/** Real ADK runners for the tests. */
final class Adk {
  private Adk() {}

  static final String APP = "support";

  static LlmAgent agent(String name, BaseLlm model, Object... tools) {
    LlmAgent.Builder b = LlmAgent.builder().name(name).model(model).instruction("Be brief.");
    if (tools.length > 0) {
      b.tools(tools);
    }
    return b.build();
  }

  static Runner runner(BaseAgent agent, Plugin... plugins) {
    return Runner.builder()
        .agent(agent)
        .appName(APP)
        .sessionService(new InMemorySessionService())
        .artifactService(new InMemoryArtifactService())
        .plugins(plugins)
        .build();
  }

  /** A runner keeping its sessions in {@code sessions}. */
  static Runner runner(BaseAgent agent, BaseSessionService sessions, Plugin... plugins) {
    return Runner.builder()
        .agent(agent)
        .appName(APP)
        .sessionService(sessions)
        .artifactService(new InMemoryArtifactService())
        .plugins(plugins)
        .build();
  }

  /** Creates the session {@code sessionId} of {@code userId}. */
  static String session(Runner runner, String userId, String sessionId) {
    runner.sessionService().createSession(APP, userId, (Map<String, Object>) null, sessionId).blockingGet();
    return sessionId;
  }

  static Content user(String text) {
    return Content.builder().role("user").parts(List.of(Part.fromText(text))).build();
  }

  /** The text of the run's final events, joined. */
  static String text(List<Event> events) {
    return events.stream()
        .filter(e -> !e.partial().orElse(false))
        .flatMap(e -> e.content().stream())
        .flatMap(c -> c.parts().orElse(List.of()).stream())
        .flatMap(p -> p.text().stream())
        .collect(Collectors.joining("\n"));
  }

  /** Runs one turn to its end and answers its events. */
  static List<Event> turn(Flowable<Event> run) {
    return run.toList().blockingGet();
  }
}
