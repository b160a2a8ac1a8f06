//! Hot reload of plans and provider quotas: on SIGHUP, when the config file changes (an in-place
//! edit or an atomic write + rename), and on `POST /admin/reload`.

use std::path::Path;
use std::time::Duration;

use tokio::task::JoinHandle;
use tollgate_core::Store;

use crate::state::App;

/// How often the config file is checked for changes.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies a version of a file: an atomic replace changes the inode,
/// an in-place edit the length or modification time.
fn fingerprint(path: &Path) -> Option<(u64, u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let ino = 0;
    Some((ino, m.len(), m.modified().ok()?))
}

/// Starts the SIGHUP listener and the file watcher for `app` (nothing when
/// it serves the embedded default). The tasks end when aborted.
pub fn spawn<S: Store + Clone>(app: App<S>) -> Vec<JoinHandle<()>> {
    let Some(path) = app.config_path().map(Path::to_path_buf) else {
        return Vec::new();
    };
    let mut tasks = Vec::new();
    #[cfg(unix)]
    {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                tracing::warn!("cannot listen for SIGHUP; reload by file change or /admin/reload");
                return;
            };
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the config");
                let _ = app.reload().await;
            }
        }));
    }
    tasks.push(tokio::spawn(async move {
        let mut seen = fingerprint(&path);
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = fingerprint(&path);
            if now.is_some() && now != seen {
                seen = now;
                tracing::info!(path = %path.display(), "config file changed: reloading");
                let _ = app.reload().await;
            }
        }
    }));
    tasks
}
