//! The shutdown signal: SIGTERM or SIGINT (Ctrl-C).

use std::future::Future;

/// Completes on SIGTERM or SIGINT. The handlers are installed when this is
/// called (within a tokio runtime), not when the future is first polled:
/// a signal that arrives after the server printed its banner but before
/// the future ran would otherwise kill the process instead of draining it.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            async fn recv(s: Option<Signal>) {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = recv(term) => {}
                () = recv(int) => {}
            }
            tracing::info!("shutting down: draining requests in flight");
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down: draining requests in flight");
        }
    }
}
