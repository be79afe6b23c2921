//! A TCP stream the connection's task reads and writes while the listener's watchdog can still
//! shut it down: tokio's stream behind an `Arc`, driven through its `&self` readiness methods.
//!
//! Why not a duplicated file descriptor for the watchdog: every connection would hold two, and a
//! listener full of 10,000 connections would need 20,000. Why not tokio's own `AsyncRead` on the
//! stream: it needs the stream exclusively. The one cost of this path is that a read's buffer is
//! zeroed before the read (tokio reads into uninitialised memory with `unsafe`, which this crate
//! forbids): at most [`READ_CHUNK`] bytes a read, a request head or a small body's size.
//!
//! Each read also says when its bytes became readable ([`SharedStream::data_since`]): under
//! overload a task woken by its socket runs long after, and a deadline that starts at the bytes
//! (the body's, from its head; the next head's, from its first byte) must not start that late.
//! - A read that had to wait is woken through [`ReadWake`], which notes the time the runtime's
//!   I/O driver saw the socket readable (it polls for events every few milliseconds however long
//!   the run queues are) before it wakes the task.
//! - The connection's first read goes to the socket directly, not through the runtime's
//!   readiness (a socket registered a moment ago has none yet): bytes already there came at some
//!   time since the accept, which is the time given.

use std::io::{self, Read as _};
use std::net::Shutdown;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker, ready};

use futures::task::AtomicWaker;
use rebate_resilience::Ticker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The most one read takes from the socket.
const READ_CHUNK: usize = 8192;

/// A shared [`TcpStream`] as an `AsyncRead + AsyncWrite`.
#[derive(Debug)]
pub(super) struct SharedStream {
    stream: Arc<TcpStream>,
    /// No read was tried yet.
    fresh: bool,
    /// When the connection was accepted (ticker nanoseconds).
    accepted_at: u64,
    wake: Arc<ReadWake>,
    /// The last read waited for readiness (and was woken through `wake`).
    waited: bool,
    /// When the bytes of the last read became readable (ticker nanoseconds).
    data_since: u64,
}

impl SharedStream {
    pub(super) fn new(stream: Arc<TcpStream>, ticker: Arc<dyn Ticker>, accepted_at: u64) -> Self {
        Self {
            stream,
            fresh: true,
            accepted_at,
            wake: Arc::new(ReadWake {
                task: AtomicWaker::new(),
                woken_at: AtomicU64::new(0),
                ticker,
            }),
            waited: false,
            data_since: accepted_at,
        }
    }

    /// When the bytes the last read returned became readable, at the latest (ticker
    /// nanoseconds): the read's own time when it did not have to wait.
    pub(super) fn data_since(&self) -> u64 {
        self.data_since
    }
}

/// The waker a waiting read registers with the runtime: notes when the socket became readable,
/// then wakes the connection's task.
#[derive(Debug)]
struct ReadWake {
    task: AtomicWaker,
    /// When the runtime last reported the socket readable (ticker nanoseconds; 0: not since the
    /// read began to wait).
    woken_at: AtomicU64,
    ticker: Arc<dyn Ticker>,
}

impl Wake for ReadWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.woken_at.compare_exchange(
            0,
            self.ticker.now_nanos(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        self.task.wake();
    }
}

impl AsyncRead for SharedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if std::mem::take(&mut this.fresh) {
            let room = buf.remaining().min(READ_CHUNK);
            let socket = socket2::SockRef::from(&*this.stream);
            match (&*socket).read(buf.initialize_unfilled_to(room)) {
                Ok(read) => {
                    buf.advance(read);
                    this.data_since = this.accepted_at;
                    return Poll::Ready(Ok(()));
                }
                // Nothing yet: on to the runtime's readiness.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        loop {
            this.wake.task.register(cx.waker());
            let waker = Waker::from(Arc::clone(&this.wake));
            let mut recording = Context::from_waker(&waker);
            if this.stream.poll_read_ready(&mut recording)?.is_pending() {
                if !this.waited {
                    this.waited = true;
                    this.wake.woken_at.store(0, Ordering::Release);
                }
                return Poll::Pending;
            }
            let room = buf.remaining().min(READ_CHUNK);
            match this.stream.try_read(buf.initialize_unfilled_to(room)) {
                Ok(read) => {
                    buf.advance(read);
                    let now = this.wake.ticker.now_nanos();
                    let woken_at = this.wake.woken_at.load(Ordering::Acquire);
                    this.data_since = if std::mem::take(&mut this.waited) && woken_at != 0 {
                        woken_at.min(now)
                    } else {
                        now
                    };
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale: `try_read` cleared it, the next poll waits for new (and
                // its time is the next wake's).
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    this.waited = true;
                    this.wake.woken_at.store(0, Ordering::Release);
                }
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncWrite for SharedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.stream).shutdown(Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rebate_resilience::ManualTicker;
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::TcpListener;

    use super::*;

    /// A read that waited says its bytes' time is when the runtime saw them readable, not when
    /// the task got to read them.
    #[tokio::test]
    async fn a_read_that_waited_dates_its_bytes_from_the_wake() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let ticker = ManualTicker::new();
        let accepted_at = ticker.now_nanos();
        let mut stream =
            SharedStream::new(Arc::new(accepted), Arc::new(ticker.clone()), accepted_at);
        let mut bytes = [0_u8; 64];
        let mut read = |stream: &mut SharedStream| {
            let mut buf = ReadBuf::new(&mut bytes);
            let waker = Waker::noop();
            match Pin::new(stream).poll_read(&mut Context::from_waker(waker), &mut buf) {
                Poll::Ready(result) => Some(result.map(|()| buf.filled().len()).unwrap()),
                Poll::Pending => None,
            }
        };
        // Nothing sent: the first (direct) read and the waiting one find nothing.
        assert_eq!(read(&mut stream), None);
        ticker.advance(Duration::from_secs(1));
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let readable_at = ticker.now_nanos();
        // The runtime's driver sees the socket readable and wakes through `ReadWake`.
        for _ in 0..1000 {
            if stream.wake.woken_at.load(Ordering::Acquire) != 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The task gets to it three seconds later.
        ticker.advance(Duration::from_secs(3));
        assert_eq!(read(&mut stream), Some(16));
        assert_eq!(stream.data_since(), readable_at);
        // Bytes that came while the task was not waiting for them are dated by the read.
        ticker.advance(Duration::from_secs(1));
        client.write_all(b"host: x\r\n").await.unwrap();
        let mut later = None;
        for _ in 0..1000 {
            later = read(&mut stream);
            if later.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(later, Some(9));
        assert_eq!(stream.data_since(), ticker.now_nanos());
    }
}
