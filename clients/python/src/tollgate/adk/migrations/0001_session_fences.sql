CREATE TABLE tollgate_session_fences (
    app_name   TEXT        NOT NULL,
    user_id    TEXT        NOT NULL,
    session_id TEXT        NOT NULL,
    fence      BIGINT      NOT NULL CHECK (fence > 0),
    token      UUID        NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (app_name, user_id, session_id)
);
CREATE INDEX tollgate_session_fences_updated ON tollgate_session_fences (updated_at);
