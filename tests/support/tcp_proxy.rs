//! A TCP fault proxy in front of PostgreSQL: it forwards bytes both ways and, on demand, turns
//! the connections open at that moment dark (nothing forwarded either way, no FIN, no RST: the
//! sockets stay open, as after a lost NAT entry or a failover behind a load balancer), resets
//! them (RST), or delays everything it forwards, or only the server's answers. Connections
//! made after a fault work.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct TcpProxy {
    /// Where clients connect: `127.0.0.1:port`.
    port: u16,
    shared: Arc<Shared>,
    /// A runtime of its own, so the proxy keeps forwarding while a test blocks its threads;
    /// dropping it closes every connection.
    runtime: Option<tokio::runtime::Runtime>,
}

struct Shared {
    upstream: SocketAddr,
    /// Connections accepted so far; each connection is numbered in order of arrival.
    accepted: AtomicU64,
    control: watch::Sender<Control>,
}

/// Which connections suffer which fault. Faults apply to connections by number, so those
/// accepted after a fault was set are untouched by it.
#[derive(Clone, Copy, Default)]
struct Control {
    /// Connections numbered below this forward nothing any more.
    dark_below: u64,
    /// Connections numbered below this are reset.
    reset_below: u64,
    /// Added before each chunk is forwarded, either way.
    delay: Duration,
    /// Added before each chunk from the server is forwarded: a statement runs (and commits)
    /// at once, its answer comes late.
    answer_delay: Duration,
}

impl TcpProxy {
    /// A proxy on a free loopback port in front of `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> TcpProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tcp-proxy")
            .enable_all()
            .build()
            .expect("tcp proxy runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let (control, _) = watch::channel(Control::default());
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            accepted: AtomicU64::new(0),
            control,
        });
        let accept_shared = shared.clone();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("register listener");
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let n = accept_shared.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(client, n, accept_shared.clone()));
            }
        });
        TcpProxy {
            port,
            shared,
            runtime: Some(runtime),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` with the upstream's port replaced by the proxy's.
    pub fn url_through(&self, url: &str) -> String {
        let upstream = format!(":{}/", self.shared.upstream.port());
        assert!(
            url.contains(&upstream),
            "{url} does not name port {upstream}"
        );
        url.replace(&upstream, &format!(":{}/", self.port))
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Every connection open now stops forwarding, both ways, and stays open.
    pub fn blackhole_existing(&self) {
        let n = self.accepted();
        self.shared.control.send_modify(|c| c.dark_below = n);
    }

    /// Every connection, open now or made later, forwards nothing: the whole link is dark.
    pub fn blackhole_all(&self) {
        self.shared.control.send_modify(|c| c.dark_below = u64::MAX);
    }

    /// Every connection open now is closed with a RST, both ways.
    pub fn reset_existing(&self) {
        let n = self.accepted();
        self.shared.control.send_modify(|c| c.reset_below = n);
    }

    /// Every chunk forwarded from now on, on any connection, waits `delay` first.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.control.send_modify(|c| c.delay = delay);
    }

    /// Every chunk the server sends from now on waits `delay` before it is forwarded; what
    /// the client sends goes through at once.
    pub fn set_answer_delay(&self, delay: Duration) {
        self.shared.control.send_modify(|c| c.answer_delay = delay);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn serve(mut client: TcpStream, n: u64, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let Ok(mut server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let mut control = shared.control.subscribe();
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    loop {
        let c = *control.borrow_and_update();
        if n < c.reset_below {
            // Zero linger turns close into RST.
            let _ = client.set_zero_linger();
            let _ = server.set_zero_linger();
            return;
        }
        if n < c.dark_below {
            // Both sockets stay open and unread; only a reset (or the proxy's end) closes them.
            if control.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            continue;
        }
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(len @ 1..) = read else { return };
                if !c.delay.is_zero() {
                    tokio::time::sleep(c.delay).await;
                }
                if server.write_all(&up[..len]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut down) => {
                let Ok(len @ 1..) = read else { return };
                let delay = c.delay + c.answer_delay;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if client.write_all(&down[..len]).await.is_err() {
                    return;
                }
            }
            _ = control.changed() => {}
        }
    }
}
