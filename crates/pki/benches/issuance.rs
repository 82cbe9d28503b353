//! Certificates issued per second on one core (a fresh ECDSA P-256 key plus a leaf signed by
//! a P-256 CA), printed beside `openssl speed -seconds 3 ecdsap256` from the same machine and
//! run, as a ratio. Run with `cargo bench -p caretaker-pki --bench issuance`.
//!
//! The target is at least one third of openssl's raw sign rate: issuance does two
//! signatures' worth of work (key generation and signing) plus X.509 encoding.

use std::process::Command;
use std::time::{Duration, Instant};

use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

const MEASURE_FOR: Duration = Duration::from_secs(3);

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing that means "run".
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let ca = CertificateAuthority::create(&CaSpec::new("bench-ca")).expect("CA");
    let spec = LeafSpec::new("node-1", Usage::Both)
        .with_dns_names(["node-1", "node-1.cluster.local"])
        .with_ip_addresses(["10.0.0.7".parse().unwrap()]);

    // Warm up caches and the allocator.
    for _ in 0..200 {
        ca.issue(&spec).expect("issue");
    }
    let start = Instant::now();
    let mut issued = 0u64;
    while start.elapsed() < MEASURE_FOR {
        for _ in 0..100 {
            std::hint::black_box(ca.issue(&spec).expect("issue"));
        }
        issued += 100;
    }
    let per_second = issued as f64 / start.elapsed().as_secs_f64();
    println!(
        "caretaker-pki issuance (fresh P-256 key + signed leaf, 1 thread): {per_second:.0} certificates/s"
    );

    match openssl_sign_rate() {
        Some(openssl) => {
            let ratio = per_second / openssl;
            println!("openssl speed -seconds 3 ecdsap256 (1 process): {openssl:.0} signs/s");
            println!(
                "ratio: {ratio:.2} of openssl's raw sign rate (target >= 0.33: {})",
                if ratio >= 1.0 / 3.0 { "met" } else { "NOT met" }
            );
        }
        None => println!("openssl speed: not available on this machine; no ratio printed"),
    }
}

/// Parses the `sign/s` column of the `256 bits ecdsa (nistp256)` row.
fn openssl_sign_rate() -> Option<f64> {
    let output = Command::new("openssl")
        .args(["speed", "-seconds", "3", "ecdsap256"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let row = text.lines().find(|l| l.contains("ecdsa (nistp256)"))?;
    let columns: Vec<&str> = row.split_whitespace().collect();
    columns.get(columns.len().checked_sub(2)?)?.parse().ok()
}
