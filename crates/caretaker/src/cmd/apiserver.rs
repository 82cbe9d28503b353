//! `caretaker apiserver`: the embedded Kubernetes-compatible API server.

use std::process::ExitCode;

/// Serve the embedded Kubernetes-compatible API server (crates/apiserver).
#[derive(Debug, clap::Args)]
pub struct ApiserverArgs {}

pub fn run(_args: ApiserverArgs) -> ExitCode {
    eprintln!("caretaker apiserver: not built yet (tracked in the embedded API server issue)");
    ExitCode::from(2)
}
