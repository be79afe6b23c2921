//! The listener's accept thread: an OS thread, outside the runtime, that takes each connection
//! off the kernel's queue at once, admits it into the connection table or refuses it (a JSON 503,
//! written without blocking), spawns its task on the runtime, and sweeps the table between
//! accepts ([`super::table::ConnectionTable::sweep`]). Whatever the runtime's queues hold, a
//! connection is accepted, refused or closed at its deadline on time.

use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::table::{self, Admission, ConnectionTable, SlotGuard, SlotKind};
use super::{Connection, ConnectionLimits, ConnectionStats, PeerService, serve_connection};

/// `listener` as a blocking std listener whose `accept` gives up every [`table::SWEEP_EVERY`]
/// (`SO_RCVTIMEO` bounds `accept` on Linux), so that its thread sweeps the table and sees a stop
/// in time.
pub(super) fn blocking_listener(listener: TcpListener) -> io::Result<std::net::TcpListener> {
    let listener = listener.into_std()?;
    listener.set_nonblocking(false)?;
    socket2::SockRef::from(&listener).set_read_timeout(Some(table::SWEEP_EVERY))?;
    Ok(listener)
}

/// What the serving task tells the accept thread.
#[derive(Debug, Default)]
pub(super) struct AcceptControl(AtomicU8);

impl AcceptControl {
    const RUNNING: u8 = 0;
    /// Close the listener, keep sweeping through the drain.
    pub(super) const STOP_ACCEPTING: u8 = 1;
    const EXIT: u8 = 2;

    pub(super) fn set(&self, state: u8) {
        self.0.fetch_max(state, Ordering::AcqRel);
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }
}

pub(super) struct StopOnDrop(pub(super) Arc<AcceptControl>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set(AcceptControl::EXIT);
    }
}

/// The accept thread's state: admits each connection at once (or refuses it) and spawns its
/// task on the runtime; sweeps the table between accepts.
pub(super) struct Acceptor<S> {
    pub(super) table: Arc<ConnectionTable>,
    pub(super) limits: Arc<ConnectionLimits>,
    pub(super) stats: Arc<ConnectionStats>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) connections: TaskTracker,
    pub(super) shutdown: CancellationToken,
    pub(super) force_close: CancellationToken,
    pub(super) router: S,
}

impl<S> Acceptor<S>
where
    S: PeerService + Clone + Send + 'static,
    S::Future: Send,
{
    pub(super) fn run(
        self,
        listener: std::net::TcpListener,
        control: &AcceptControl,
        listener_closed: tokio::sync::oneshot::Sender<()>,
    ) {
        // Accepted sockets register with this runtime's reactor from here.
        let _runtime = self.runtime.enter();
        let mut listener = Some(listener);
        let mut listener_closed = Some(listener_closed);
        let sweep_every = u64::try_from(table::SWEEP_EVERY.as_nanos()).unwrap_or(u64::MAX);
        let mut next_sweep = self.table.now().saturating_add(sweep_every);
        loop {
            match control.get() {
                AcceptControl::RUNNING => {}
                AcceptControl::STOP_ACCEPTING => {
                    listener = None;
                    if let Some(closed) = listener_closed.take() {
                        let _ = closed.send(());
                    }
                }
                _ => return,
            }
            match &listener {
                Some(listener) => match listener.accept() {
                    Ok((stream, peer)) => self.admit(stream, peer),
                    // The accept timeout (nothing to accept), or a connection the client
                    // reset before it was accepted.
                    Err(error)
                        if matches!(
                            error.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::Interrupted
                                | io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::ConnectionReset
                        ) => {}
                    Err(error) => {
                        // Out of file descriptors: back off a little instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                },
                None => std::thread::sleep(table::SWEEP_EVERY),
            }
            let now = self.table.now();
            if now >= next_sweep {
                self.table.sweep();
                next_sweep = now.saturating_add(sweep_every);
            }
        }
    }

    /// Admits or refuses a connection; the counters move once it is spawned or answered.
    fn admit(&self, stream: std::net::TcpStream, peer: SocketAddr) {
        // The first head's time runs from here, on the runtime's clock (its connection's timers
        // are on it), not from the task's first poll, which an overloaded runtime makes late.
        let accepted_at = Instant::now();
        let (index, kind) = match self.table.admit(peer.ip()) {
            Admission::Admitted { slot, kind } => (slot, kind),
            Admission::ListenerFull => {
                refuse(
                    stream,
                    "this listener holds its maximum of connections",
                    &self.stats.refused_listener_full,
                );
                return;
            }
            Admission::PeerFull => {
                refuse(
                    stream,
                    "this address holds its maximum of connections",
                    &self.stats.refused_peer_full,
                );
                return;
            }
        };
        let slot = SlotGuard::new(Arc::clone(&self.table), index);
        // Small answers: do not wait for the peer's ACK before sending the next segment.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let stream = match stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream))
        {
            Ok(stream) => Arc::new(stream),
            Err(error) => {
                // The runtime is shutting down, or the socket is already gone.
                tracing::debug!(%error, "cannot register an accepted connection");
                return;
            }
        };
        slot.attach(Arc::downgrade(&stream));
        self.connections.spawn_on(
            serve_connection(
                stream,
                peer,
                self.router.clone(),
                Arc::clone(&self.limits),
                Connection {
                    shutdown: self.shutdown.clone(),
                    force_close: self.force_close.clone(),
                    slot,
                    kind,
                    accepted_at,
                },
            ),
            &self.runtime,
        );
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        if kind == SlotKind::Probe {
            self.stats.probe_accepted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The JSON body of a `503 too_many_connections` and its trace id.
pub(super) fn too_many_connections_body(
    message: &'static str,
) -> (rebate_telemetry::TraceId, String) {
    let trace_id = rebate_telemetry::TraceId::generate();
    let body = serde_json::json!({
        "error": {"code": rebate_domain::ErrorCode::TooManyConnections, "message": message},
        "trace_id": trace_id,
    })
    .to_string();
    (trace_id, body)
}

/// Answers a connection over a cap with a 503, counts it in `refused`, and closes it, from the
/// accept thread: never blocking it (a fresh socket's send buffer takes the answer whole; else the
/// client gets the close alone), and reading what the client already sent so that the close is a
/// FIN, not a reset that could discard the answer.
fn refuse(stream: std::net::TcpStream, message: &'static str, refused: &AtomicU64) {
    let (trace_id, body) = too_many_connections_body(message);
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nx-trace-id: {trace_id}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    refused.fetch_add(1, Ordering::Relaxed);
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let _ = (&stream).write_all(response.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0_u8; 4096];
    for _ in 0..4 {
        if !matches!((&stream).read(&mut sink), Ok(read) if read > 0) {
            break;
        }
    }
}
