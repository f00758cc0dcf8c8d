//! A TCP forwarder that holds every chunk for a fixed one-way delay in each direction,
//! emulating a network round-trip time of twice that delay for whatever crosses it.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A running delay proxy; it stops when dropped.
pub struct DelayProxy {
    pub addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
}

impl DelayProxy {
    /// Starts forwarding a fresh port on 127.0.0.1 to `target` with `one_way` delay.
    pub fn start(target: SocketAddr, one_way: Duration) -> std::io::Result<DelayProxy> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        rt.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(forward(cr, sw, one_way));
                    tokio::spawn(forward(sr, cw, one_way));
                });
            }
        });
        Ok(DelayProxy { addr, _rt: rt })
    }
}

/// Copies one direction, delivering each chunk `delay` after it was read, in order.
async fn forward(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn the_proxy_adds_its_delay_to_a_round_trip() {
        let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut b = [0u8; 4];
            while s.read_exact(&mut b).is_ok() {
                s.write_all(&b).unwrap();
            }
        });
        let proxy = DelayProxy::start(target, Duration::from_millis(5)).unwrap();
        let mut c = std::net::TcpStream::connect(proxy.addr).unwrap();
        c.set_nodelay(true).unwrap();
        let t = std::time::Instant::now();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        let rtt = t.elapsed();
        assert_eq!(&b, b"ping");
        assert!(rtt >= Duration::from_millis(10), "{rtt:?}");
        assert!(rtt < Duration::from_millis(200), "{rtt:?}");
    }
}
