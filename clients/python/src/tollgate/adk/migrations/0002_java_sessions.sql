CREATE TABLE tollgate_java_sessions (
    app_name   TEXT        NOT NULL,
    user_id    TEXT        NOT NULL,
    session_id TEXT        NOT NULL,
    state      JSONB       NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
);
CREATE INDEX tollgate_java_sessions_updated ON tollgate_java_sessions (updated_at);
CREATE TABLE tollgate_java_events (
    app_name      TEXT   NOT NULL,
    user_id       TEXT   NOT NULL,
    session_id    TEXT   NOT NULL,
    seq           BIGINT GENERATED ALWAYS AS IDENTITY,
    event_id      TEXT   NOT NULL,
    invocation_id TEXT   NOT NULL,
    timestamp_ms  BIGINT NOT NULL,
    event         JSONB  NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id, seq),
    UNIQUE (app_name, user_id, session_id, event_id),
    FOREIGN KEY (app_name, user_id, session_id)
        REFERENCES tollgate_java_sessions (app_name, user_id, session_id) ON DELETE CASCADE
);
CREATE TABLE tollgate_java_app_states (
    app_name   TEXT        PRIMARY KEY,
    state      JSONB       NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE tollgate_java_user_states (
    app_name   TEXT        NOT NULL,
    user_id    TEXT        NOT NULL,
    state      JSONB       NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (app_name, user_id)
);
