//! The edge: what one client may hold of this replica, bounded before any
//! limit is decided (`[limits]` in the config, docs/config.md).
//!
//! - **Connections.** Each listener (`listen`, `admin_listen`,
//!   `grpc_listen`, `rls_listen`) holds at most `max_connections` open
//!   connections; a connection past the cap is closed as soon as it is
//!   accepted.
//! - **Headers.** HTTP/1: a request's headers must be complete within
//!   `header_timeout_ms` of the connection opening or of its previous
//!   response (hyper's header-read timer, which needs the timer this module
//!   sets): a slow request line is closed, and so is a kept-alive
//!   connection that sends nothing more. gRPC: the first byte (the HTTP/2
//!   preface) must arrive within the same time.
//! - **Bodies.** The `/v1` routes read the whole body within
//!   `body_timeout_ms` before they take a place under the in-flight cap
//!   (`http/routes.rs`, `admit`); past it, 408 `request_timeout` and the
//!   connection is closed.
//! - **Drain.** On shutdown the listeners stop accepting, ask every
//!   connection to finish its request and close, and after
//!   `drain_timeout_ms` close what is still open.
//! - **gRPC** (both tonic servers): at most `grpc_max_streams` concurrent
//!   streams per connection, HTTP/2 keep-alive pings every
//!   `grpc_keepalive_ms` (a peer that does not answer one within the same
//!   time is closed), TCP keep-alive, messages of at most 64 KiB.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tollgate_outcome::TooManyWaits;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
use tower_service::Service;

/// The edge limits, validated (`[limits]`; every field read at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeLimits {
    /// Open connections per listener.
    pub max_connections: usize,
    /// HTTP/1: headers complete within this of the connection opening or
    /// its previous response; gRPC: the first byte within it.
    pub header_timeout: Duration,
    /// A `/v1` request's whole body within this of its headers.
    pub body_timeout: Duration,
    /// How long shutdown waits for open connections before closing them.
    pub drain_timeout: Duration,
    /// `wait=true` requests one user may have waiting at once.
    pub max_waits_per_user: usize,
    /// `wait=true` requests this replica holds waiting at once (all users).
    pub max_waiting: usize,
    /// gRPC: concurrent streams per HTTP/2 connection.
    pub grpc_max_streams: u32,
    /// gRPC: the HTTP/2 keep-alive ping interval, and how long a ping may
    /// go unanswered.
    pub grpc_keepalive: Duration,
    /// Rate refusals the limiter keeps to answer locally (SPEC §3; 0:
    /// none).
    pub refusal_cache: usize,
}

/// `max_connections` when not set.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// `header_timeout_ms` when not set.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// `body_timeout_ms` when not set.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 10_000;
/// `drain_timeout_ms` when not set.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 30_000;
/// `max_waits_per_user` when not set.
pub const DEFAULT_MAX_WAITS_PER_USER: usize = 8;
/// `grpc_max_streams` when not set.
pub const DEFAULT_GRPC_MAX_STREAMS: u32 = 100;
/// `grpc_keepalive_ms` when not set.
pub const DEFAULT_GRPC_KEEPALIVE_MS: u64 = 20_000;

impl EdgeLimits {
    /// The defaults for a replica serving at most `max_in_flight` requests
    /// at once (`max_waiting` is half of it, at least 1).
    pub fn defaults(max_in_flight: usize) -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_millis(DEFAULT_HEADER_TIMEOUT_MS),
            body_timeout: Duration::from_millis(DEFAULT_BODY_TIMEOUT_MS),
            drain_timeout: Duration::from_millis(DEFAULT_DRAIN_TIMEOUT_MS),
            max_waits_per_user: DEFAULT_MAX_WAITS_PER_USER,
            max_waiting: (max_in_flight / 2).max(1),
            grpc_max_streams: DEFAULT_GRPC_MAX_STREAMS,
            grpc_keepalive: Duration::from_millis(DEFAULT_GRPC_KEEPALIVE_MS),
            refusal_cache: tollgate_core::limiter::DEFAULT_REFUSAL_CACHE_ENTRIES,
        }
    }

    /// A tonic server builder with this edge's HTTP/2 bounds.
    pub(crate) fn grpc_server(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.grpc_max_streams)
            .http2_keepalive_interval(Some(self.grpc_keepalive))
            .http2_keepalive_timeout(Some(self.grpc_keepalive))
            .http2_max_header_list_size(MAX_GRPC_HEADER_BYTES)
    }
}

/// The largest header list a gRPC call may send, bytes (a JWT and the
/// call's metadata fit many times over).
const MAX_GRPC_HEADER_BYTES: u32 = 16 * 1024;

/// The signal that closes every connection still open after the drain
/// deadline: `true` once it has passed.
#[derive(Debug, Clone)]
pub(crate) struct Closer {
    rx: watch::Receiver<bool>,
}

/// Sets the drain deadline's end for every [`Closer`] made from it.
#[derive(Debug)]
pub(crate) struct CloseAll {
    tx: watch::Sender<bool>,
}

/// A pair: the deadline's trigger and the signal connections watch.
pub(crate) fn closer() -> (CloseAll, Closer) {
    let (tx, rx) = watch::channel(false);
    (CloseAll { tx }, Closer { rx })
}

impl CloseAll {
    /// Closes every connection watching this.
    pub(crate) fn close(&self) {
        let _ = self.tx.send(true);
    }
}

/// Serves `router` on `listener` (HTTP/1) until `stopped` completes, within
/// `limits`, then drains: each connection finishes the request it is
/// serving (an idle one closes at once); after `drain_timeout` the rest are
/// closed. `name` is the config field, for the logs.
///
/// # Errors
///
/// Never: a failing accept is logged and retried.
pub(crate) async fn serve_http(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    limits: &EdgeLimits,
    stopped: impl Future<Output = ()>,
) -> io::Result<()> {
    let cap = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let (finish, finishing) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut stopped = pin!(stopped);
    let mut refused: u64 = 0;
    loop {
        tokio::select! {
            () = &mut stopped => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        accept_failed(name, &e).await;
                        continue;
                    }
                };
                let Ok(permit) = cap.clone().try_acquire_owned() else {
                    refused += 1;
                    refused_connection(name, peer, refused, limits.max_connections);
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let router = router.clone();
                let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    let mut router = router.clone();
                    async move { router.call(req).await }
                });
                let conn = http.serve_connection(TokioIo::new(stream), service);
                let mut finishing = finishing.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    let mut conn = pin!(conn);
                    tokio::select! {
                        served = conn.as_mut() => {
                            if let Err(e) = served {
                                tracing::debug!(listener = name, %peer, error = %e, "connection ended");
                            }
                        }
                        () = async { let _ = finishing.wait_for(|f| *f).await; } => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        }
    }
    // No new connections from here; the open ones finish what they serve.
    drop(listener);
    let _ = finish.send(true);
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            listener = name,
            open = conns.len(),
            "drain deadline passed: closing the connections still open"
        );
        conns.shutdown().await;
    }
    Ok(())
}

/// Logs a failed accept; waits a little when it is not about one
/// connection (out of file descriptors), so the loop does not spin.
async fn accept_failed(name: &'static str, e: &io::Error) {
    use io::ErrorKind as K;
    if matches!(
        e.kind(),
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused
    ) {
        return;
    }
    tracing::error!(listener = name, error = %e, "accept failed; retrying in 50 ms");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Logs a connection refused at the cap (the first, then every 1,000th).
fn refused_connection(name: &'static str, peer: SocketAddr, refused: u64, cap: usize) {
    if refused == 1 || refused.is_multiple_of(1_000) {
        tracing::warn!(
            listener = name,
            %peer,
            refused,
            "connection closed: this listener holds its max_connections ({cap})"
        );
    }
}

/// Accepted gRPC connections under a listener's cap: a connection past it
/// is closed at once; each one is closed when [`Closer`] fires, and when
/// its first byte does not arrive within the header timeout.
pub(crate) struct CappedIncoming {
    name: &'static str,
    inner: TcpIncoming,
    cap: Arc<Semaphore>,
    max: usize,
    first_byte: Duration,
    closer: Closer,
    refused: u64,
}

impl CappedIncoming {
    /// `listener`'s connections (no Nagle, TCP keep-alive) within `limits`.
    pub(crate) fn new(
        name: &'static str,
        listener: TcpListener,
        limits: &EdgeLimits,
        closer: Closer,
    ) -> Self {
        Self {
            name,
            inner: TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(limits.grpc_keepalive)),
            cap: Arc::new(Semaphore::new(limits.max_connections)),
            max: limits.max_connections,
            first_byte: limits.header_timeout,
            closer,
            refused: 0,
        }
    }
}

impl futures_core::Stream for CappedIncoming {
    type Item = io::Result<Guarded>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let Some(accepted) = ready!(Pin::new(&mut this.inner).poll_next(cx)) else {
                return Poll::Ready(None);
            };
            let stream = match accepted {
                Ok(s) => s,
                Err(e) => return Poll::Ready(Some(Err(e))),
            };
            match this.cap.clone().try_acquire_owned() {
                Ok(permit) => {
                    return Poll::Ready(Some(Ok(Guarded::new(
                        stream,
                        permit,
                        &this.closer,
                        this.first_byte,
                    ))));
                }
                Err(_) => {
                    this.refused += 1;
                    if let Ok(peer) = stream.peer_addr() {
                        refused_connection(this.name, peer, this.refused, this.max);
                    }
                    drop(stream);
                }
            }
        }
    }
}

type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A gRPC connection's socket, holding its place under the listener's cap:
/// reads and writes fail once the drain deadline has passed, and reads
/// fail when no first byte arrived within the header timeout.
pub(crate) struct Guarded {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    closed: Signal,
    first_byte: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Guarded {
    fn new(io: TcpStream, permit: OwnedSemaphorePermit, closer: &Closer, first: Duration) -> Self {
        let mut rx = closer.rx.clone();
        Self {
            io,
            _permit: permit,
            closed: Box::pin(async move {
                // An error: the sender is gone, serving has ended.
                let _ = rx.wait_for(|c| *c).await;
            }),
            first_byte: Some(Box::pin(tokio::time::sleep(first))),
        }
    }

    fn check_closed(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.closed.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed at the drain deadline",
            ));
        }
        Ok(())
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Some(deadline) = &mut this.first_byte {
            match &read {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.first_byte = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "nothing sent within the header timeout",
                    )));
                }
                _ => {}
            }
        }
        read
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

/// Serves a tonic `router` on `incoming` until `stopping` turns `true`,
/// then drains for `limits.drain_timeout` and closes what is left (through
/// `close_all`, which the incoming connections watch).
///
/// # Errors
///
/// The gRPC server failed.
pub(crate) async fn serve_grpc(
    name: &'static str,
    router: tonic::transport::server::Router,
    incoming: CappedIncoming,
    close_all: CloseAll,
    limits: &EdgeLimits,
    stopping: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        // An error: the sender is gone, which only happens at the end.
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let serving = router.serve_with_incoming_shutdown(incoming, stopped(stopping.clone()));
    let mut serving = pin!(serving);
    tokio::select! {
        served = serving.as_mut() => return served,
        () = stopped(stopping) => {}
    }
    match tokio::time::timeout(limits.drain_timeout, serving.as_mut()).await {
        Ok(served) => served,
        Err(_) => {
            tracing::warn!(
                listener = name,
                "drain deadline passed: closing the connections still open"
            );
            close_all.close();
            // Each connection fails at its next poll; do not wait on one
            // that is not polled any more.
            match tokio::time::timeout(Duration::from_secs(1), serving).await {
                Ok(served) => served,
                Err(_) => Ok(()),
            }
        }
    }
}

/// The `wait=true` requests waiting on this replica: at most
/// `max_waits_per_user` of one user and `max_waiting` of all users
/// (SPEC §8). Its map holds only users with a request waiting, so it never
/// has more than `max_waiting` entries. Cloning shares it.
#[derive(Debug, Clone)]
pub struct WaitGate {
    total: Arc<Semaphore>,
    max_total: usize,
    per_user: usize,
    users: Arc<parking_lot::Mutex<HashMap<String, usize>>>,
}

/// One `wait=true` request's place; dropping it frees the place.
#[must_use = "the place is freed as soon as this is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct WaitPlace {
    _permit: OwnedSemaphorePermit,
    users: Arc<parking_lot::Mutex<HashMap<String, usize>>>,
    user: String,
}

impl WaitGate {
    /// At most `per_user` waiting requests of one user, `total` in all.
    ///
    /// # Panics
    ///
    /// If `total` exceeds tokio's semaphore limit (config validation keeps
    /// it far below).
    #[track_caller]
    pub fn new(per_user: usize, total: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            max_total: total,
            per_user,
            users: Arc::default(),
        }
    }

    /// A place for one more waiting request of `user`, now or never.
    ///
    /// # Errors
    ///
    /// [`TooManyWaits`]: the user's or the replica's bound is reached.
    pub fn enter(&self, user: &str) -> Result<WaitPlace, TooManyWaits> {
        let mut users = self.users.lock();
        if users.get(user).copied().unwrap_or(0) >= self.per_user {
            return Err(TooManyWaits::User(self.per_user));
        }
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| TooManyWaits::Replica(self.max_total))?;
        *users.entry(user.to_owned()).or_insert(0) += 1;
        Ok(WaitPlace {
            _permit: permit,
            users: self.users.clone(),
            user: user.to_owned(),
        })
    }

    /// Waiting requests now (all users).
    pub fn waiting(&self) -> usize {
        self.max_total - self.total.available_permits()
    }
}

impl Drop for WaitPlace {
    fn drop(&mut self) {
        let mut users = self.users.lock();
        if let Some(n) = users.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                users.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_bounded_per_user_and_in_all() {
        let gate = WaitGate::new(2, 3);
        let a1 = gate.enter("a").unwrap();
        let _a2 = gate.enter("a").unwrap();
        assert_eq!(gate.enter("a").unwrap_err(), TooManyWaits::User(2));
        let _b1 = gate.enter("b").unwrap();
        assert_eq!(gate.enter("c").unwrap_err(), TooManyWaits::Replica(3));
        drop(a1);
        assert_eq!(gate.waiting(), 2);
        let _a3 = gate.enter("a").unwrap();
        assert_eq!(gate.users.lock().len(), 2);
    }

    #[test]
    fn the_map_forgets_users_with_nothing_waiting() {
        let gate = WaitGate::new(8, 8);
        let places: Vec<_> = (0..8)
            .map(|i| gate.enter(&format!("u{i}")).unwrap())
            .collect();
        assert_eq!(gate.users.lock().len(), 8);
        drop(places);
        assert!(gate.users.lock().is_empty());
        assert_eq!(gate.waiting(), 0);
    }
}
