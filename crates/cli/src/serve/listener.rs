//! The HTTP listener of `ferrite serve`: accepts connections up to a cap and serves each
//! with HTTP/1.1 under three time limits, so that slow or silent clients cannot hold file
//! descriptors forever (issue 35: 20 connections sending their headers a byte at a time
//! were all kept open).
//!
//! - headers: a request's headers must be complete within `header` of the connection being
//!   ready for it (accepted, or its previous response sent); hyper's header-read timeout;
//! - idle: a connection on which no byte moved for `idle` while none of its requests is
//!   being handled is closed (a request being handled, a long generation included, is never
//!   idle);
//! - body: a request's body must be complete within `body` of its headers.
//!
//! At the cap, accepting waits (new clients wait in the kernel's backlog) until a
//! connection closes. It must never answer HTTP itself: every response is the router's.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::ServiceExt;

/// The listener's limits (module doc).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a request's headers to arrive.
    pub header: Duration,
    /// Time a connection may stay silent with no request being handled.
    pub idle: Duration,
    /// Time for a request's body to arrive, counted from its headers.
    pub body: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets every open connection
/// finish its requests (graceful shutdown) and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopped) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a client that reset before accept: the
                    // listener itself is fine, so wait briefly instead of spinning.
                    eprintln!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        tokio::spawn(connection(
            stream,
            app.clone(),
            limits,
            stopped.clone(),
            permit,
        ));
    }
    let _ = stop.send(true);
    // Every connection holds a permit until it has closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
}

/// When bytes last moved on a connection and how many of its requests are being handled.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    busy: AtomicUsize,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Marks a request as being handled until the returned guard is dropped.
    fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// Resolves once the connection has been idle (module doc) for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            // A busy connection is looked at again after a whole `idle`, the earliest it can
            // have been idle that long.
            let wait = if self.busy.load(Ordering::Relaxed) > 0 {
                idle
            } else {
                idle.saturating_sub(last.elapsed())
            };
            if wait.is_zero() {
                return;
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// A request being handled; the connection is not idle while one lives.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records on `activity` every read or write that moved bytes.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that fails once its deadline has passed before it ended.
struct DeadlineBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the request body did not arrive within {:?}", self.limit),
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves one connection until it ends, idles out or (after shutdown began) finishes.
async fn connection(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    mut stopped: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = requests.begin();
        let req = req.map(|inner| {
            Body::new(DeadlineBody {
                inner,
                deadline: Box::pin(tokio::time::sleep(limits.body)),
                limit: limits.body,
            })
        });
        let app = app.clone();
        async move {
            let response = app.oneshot(req).await?;
            // The response body holds the guard: a streamed answer is being handled until
            // its last byte.
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _busy = &busy;
                    frame
                }))
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            // A failed connection (reset, timed-out headers) concerns only its client.
            _ = conn.as_mut() => break,
            () = activity.idle_for(limits.idle) => break,
            _ = stopped.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
