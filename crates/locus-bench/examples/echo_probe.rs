//! How much does an event loop cost a request/reply? Times a 16-byte ping-pong against a
//! blocking echo thread and against an echo task on a single-threaded tokio runtime, in
//! alternating blocks. Run: cargo run --release -p locus-bench --example echo_probe
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn blocking_echo() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 16];
        while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
    });
    a
}

fn tokio_echo() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let (s, _) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            let mut s = tokio::net::TcpStream::from_std(s).unwrap();
            s.set_nodelay(true).unwrap();
            let mut b = [0u8; 16];
            while s.read_exact(&mut b).await.is_ok() && s.write_all(&b).await.is_ok() {}
        });
    });
    a
}

fn main() {
    let mut a = TcpStream::connect(blocking_echo()).unwrap();
    let mut t = TcpStream::connect(tokio_echo()).unwrap();
    a.set_nodelay(true).unwrap();
    t.set_nodelay(true).unwrap();
    let (mut va, mut vt) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        for (s, v) in [(&mut a, &mut va), (&mut t, &mut vt)] {
            for _ in 0..100 {
                let mut b = [1u8; 16];
                let start = Instant::now();
                s.write_all(&b).unwrap();
                s.read_exact(&mut b).unwrap();
                v.push(start.elapsed());
            }
        }
    }
    let p50 = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6
    };
    println!("blocking echo p50 {:.1} µs, tokio current-thread echo p50 {:.1} µs", p50(&mut va), p50(&mut vt));
}
