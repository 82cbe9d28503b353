//! Ports for listeners a test, a benchmark or the demo starts in another process.

use std::sync::Mutex;

/// A port to listen on, and to listen on again after a stop (an etcd member restarting, an
/// agent coming back). Not one the kernel hands out for port 0: those come from the ephemeral
/// range, which the outgoing connections of tests running alongside draw from too, so one of
/// them could hold the port when it is bound again (CI saw `bind: address already in use`).
/// These come from below that range (32768 and up on Linux), walked in order from a point set
/// by the process id, so none is handed out twice in a process and two processes seldom meet.
/// `Err` when every one of them is taken.
pub fn reusable_port() -> Result<u16, String> {
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    let mut next = NEXT.lock().unwrap_or_else(|p| p.into_inner());
    let mut offset = next.unwrap_or(std::process::id().wrapping_mul(7919) % COUNT);
    for _ in 0..COUNT {
        let port = (FIRST + offset) as u16;
        offset = (offset + 1) % COUNT;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *next = Some(offset);
            return Ok(port);
        }
    }
    Err(format!(
        "no free loopback port in {FIRST}..{}",
        FIRST + COUNT
    ))
}
