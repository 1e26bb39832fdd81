//! The apiserver as a machine on the lan sees it: a TCP relay whose listening socket is in the
//! lan's network namespace (on the bridge's address) and whose upstream connections go, from
//! the root namespace, to kube-apiserver on 127.0.0.1. Bytes only: TLS is end to end between the
//! kubelet and the apiserver. A machine whose link is cut cannot reach the listener, so its
//! kubelet really loses the apiserver. Plain threads, not tasks: a relay outlives the tokio
//! runtime of the test that made it when it is shared.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

/// Streams being relayed, by connection number, so that dropping the relay ends them.
type Open = Arc<Mutex<HashMap<u64, TcpStream>>>;

pub(crate) struct Relay {
    listener: Arc<TcpListener>,
    stopping: Arc<AtomicBool>,
    open: Open,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Relays every connection accepted by `listener` to `upstream`.
    pub(crate) fn start(listener: TcpListener, upstream: SocketAddr) -> Result<Self> {
        let listener = Arc::new(listener);
        let stopping = Arc::new(AtomicBool::new(false));
        let open: Open = Arc::default();
        let acceptor = {
            let (listener, stopping, open) = (listener.clone(), stopping.clone(), open.clone());
            std::thread::Builder::new()
                .name("apiserver-relay".into())
                .spawn(move || accept_loop(&listener, upstream, &stopping, &open))
                .context("starting the apiserver relay")?
        };
        Ok(Self { listener, stopping, open, acceptor: Some(acceptor) })
    }
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, stopping: &AtomicBool, open: &Open) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for downstream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        // A failed accept or upstream connect drops this one connection; the client retries.
        let Ok(downstream) = downstream else { continue };
        let Ok(upstream) = TcpStream::connect(upstream) else { continue };
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if let (Ok(down), Ok(mut map)) = (downstream.try_clone(), open.lock()) {
            map.insert(id, down);
        }
        let (Ok(down_reader), Ok(up_writer)) = (downstream.try_clone(), upstream.try_clone())
        else {
            continue;
        };
        let open = open.clone();
        let _ = std::thread::Builder::new().name("apiserver-relay-conn".into()).spawn(move || {
            let back = std::thread::spawn(move || pump(upstream, downstream));
            pump(down_reader, up_writer);
            let _ = back.join();
            if let Ok(mut map) = open.lock() {
                map.remove(&id);
            }
        });
    }
}

/// Copies `from` to `to` until either ends, then shuts `to` for writing (the half-close the
/// peer sees) and `from` for reading, so the opposite direction ends too.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // shutdown(2) on a listening socket wakes a thread blocked in accept(2) (Linux).
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        if let Ok(map) = self.open.lock() {
            for stream in map.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}
