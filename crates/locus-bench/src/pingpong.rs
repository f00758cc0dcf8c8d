//! The floor for any request/reply on this machine: a blocking client and an echo
//! thread exchanging one small message over loopback TCP. The echo thread either blocks
//! in `read` (the plain floor) or first polls its socket for a moment after each reply,
//! as `locus serve` does (`--poll-us`), which shows what polling alone saves.

use crate::stats::time_each;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Size of the message, the same as a Locus frame header.
const MESSAGE: usize = 16;

/// An echo server on a fresh port; its thread ends when the client disconnects. With
/// `poll`, the thread polls its socket for that long after each reply before it blocks.
pub fn start_echo(poll: Option<Duration>) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        while let Ok((mut s, _)) = l.accept() {
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || {
                crate::placement::pin_server_thread();
                let mut b = [0u8; MESSAGE];
                loop {
                    let got = match poll {
                        None => s.read_exact(&mut b),
                        Some(window) => read_polling(&mut s, &mut b, window),
                    };
                    if got.is_err() || s.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Fills `b`, polling the socket (yielding between tries) for up to `window`, then
/// blocking.
fn read_polling(s: &mut TcpStream, b: &mut [u8], window: Duration) -> std::io::Result<()> {
    use rustix::net::{recv, RecvFlags};
    let until = Instant::now() + window;
    let mut got = 0;
    while got < b.len() && Instant::now() < until {
        match recv(&*s, &mut b[got..], RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((n, _)) => got += n,
            Err(rustix::io::Errno::AGAIN) => std::thread::yield_now(),
            Err(e) => return Err(e.into()),
        }
    }
    s.read_exact(&mut b[got..])
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
