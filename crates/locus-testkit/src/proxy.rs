//! A TCP forwarder that holds every chunk for a fixed one-way delay in each direction,
//! emulating a network round-trip time of twice that delay for whatever crosses it.
//!
//! It runs on plain threads and sleeps with `std::thread::sleep`, which is precise to
//! tens of microseconds; tokio's timer rounds to whole milliseconds, which would turn a
//! 1 ms round trip into 3.
//!
//! A Locus client behind it logs in with a proof bound to the proxy's address, which a
//! Locus server takes only when told (`locus serve --name 127.0.0.1:*`, as
//! [`crate::peers::start_locus`] does).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A running delay proxy; it stops accepting when dropped.
pub struct DelayProxy {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Bytes forwarded client → server and server → client, over all connections.
    pub bytes: Arc<[AtomicU64; 2]>,
}

impl DelayProxy {
    /// Starts forwarding a fresh port on 127.0.0.1 to `target` with `one_way` delay.
    pub fn start(target: SocketAddr, one_way: Duration) -> std::io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let bytes: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let counters = bytes.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(target) else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                forward(client, s2, one_way, counters.clone(), 0);
                forward(server, c2, one_way, counters.clone(), 1);
            }
        });
        Ok(DelayProxy { addr, stop, bytes })
    }
}

impl DelayProxy {
    /// Total bytes forwarded in both directions so far.
    pub fn total_bytes(&self) -> u64 {
        self.bytes[0].load(Ordering::Relaxed) + self.bytes[1].load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies one direction on two threads: a reader stamps each chunk with its due time, a
/// writer sleeps until then and sends it, so chunks keep their order and spacing.
fn forward(mut from: TcpStream, mut to: TcpStream, delay: Duration, counters: Arc<[AtomicU64; 2]>, direction: usize) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    counters[direction].fetch_add(n as u64, Ordering::Relaxed);
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok((due, chunk)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_adds_its_delay_to_a_round_trip_accurately() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let mut b = [0u8; 4];
            while s.read_exact(&mut b).is_ok() {
                s.write_all(&b).unwrap();
            }
        });
        let proxy = DelayProxy::start(target, Duration::from_micros(500)).unwrap();
        let mut c = TcpStream::connect(proxy.addr).unwrap();
        c.set_nodelay(true).unwrap();
        let mut rtts = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"ping");
            rtts.push(t.elapsed());
        }
        rtts.sort();
        let p50 = rtts[rtts.len() / 2];
        assert!(p50 >= Duration::from_millis(1), "{p50:?}");
        assert!(p50 < Duration::from_micros(1900), "a 1 ms emulated round trip took {p50:?}");
    }
}
