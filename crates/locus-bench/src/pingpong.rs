//! The floor for any request/reply on this machine: a blocking client and a blocking
//! echo thread exchanging one small message over loopback TCP.

use crate::stats::time_each;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Size of the message, the same as a Locus frame header.
const MESSAGE: usize = 16;

/// An echo server on a fresh port; its thread ends when the client disconnects.
pub fn start_echo() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        while let Ok((mut s, _)) = l.accept() {
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || {
                crate::placement::pin_server_thread();
                let mut b = [0u8; MESSAGE];
                while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
            });
        }
    });
    Ok(addr)
}

/// A client connection to an echo server (maybe behind a proxy).
pub fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(s)
}

/// Round-trip latency of one small message on a connection to an echo server.
pub fn measure_on(s: &mut TcpStream, iterations: usize) -> Result<Vec<Duration>, String> {
    let mut b = [7u8; MESSAGE];
    time_each(iterations, || {
        s.write_all(&b).map_err(|e| e.to_string())?;
        s.read_exact(&mut b).map_err(|e| e.to_string())
    })
}
