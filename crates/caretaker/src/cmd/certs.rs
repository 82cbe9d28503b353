//! `caretaker certs`: a node's certificates, offline, like `kubeadm certs`.

use std::path::PathBuf;
use std::process::ExitCode;

use caretaker_agent::{NodeLayout, offline};
use caretaker_agent_api::kubeadm::SLOTS;
use clap::{Args, Subcommand};

use super::Failure;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Print each certificate's expiry, residual time and signing CA, like
    /// `kubeadm certs check-expiration`.
    CheckExpiration(NodeDirs),
    /// Renew certificates with the CA files given, without the operator: new keys are made on
    /// this node, the old files are backed up under --state-dir, and nothing changes unless
    /// every certificate could be renewed. Restart the control-plane components afterwards.
    Renew(RenewArgs),
}

#[derive(Debug, Args)]
pub struct NodeDirs {
    /// kubeadm's PKI directory.
    #[arg(long, value_name = "DIR", default_value = "/etc/kubernetes/pki")]
    pki_dir: PathBuf,
    /// Directory of the kubeconfigs.
    #[arg(long, value_name = "DIR", default_value = "/etc/kubernetes")]
    kubeconfig_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    /// Certificates to renew by kubeadm name (apiserver, etcd/peer, admin.conf, …), or `all`.
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
    /// Directory with the CAs in kubeadm layout: ca.crt/ca.key, etcd/ca.crt/etcd/ca.key,
    /// front-proxy-ca.crt/front-proxy-ca.key (only those the renewed certificates need).
    #[arg(long, value_name = "DIR")]
    ca_dir: PathBuf,
    /// Lifetime of the new certificates (e.g. 1y, 90d); capped at the CA's expiry.
    #[arg(
        long,
        value_name = "TTL",
        default_value = "1y",
        allow_hyphen_values = true
    )]
    expires_in: String,
    #[command(flatten)]
    dirs: NodeDirs,
    /// Where staged keys and backups are kept.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/caretaker-agent")]
    state_dir: PathBuf,
}

pub fn run(command: CertsCommand) -> ExitCode {
    super::run("certs", || match command {
        CertsCommand::CheckExpiration(dirs) => check_expiration(dirs),
        CertsCommand::Renew(args) => renew(args),
    })
}

fn check_expiration(dirs: NodeDirs) -> Result<ExitCode, Failure> {
    let layout = NodeLayout::new(dirs.pki_dir, dirs.kubeconfig_dir);
    let inventory = offline::inventory(&layout);
    if inventory.certificates.is_empty() && inventory.authorities.is_empty() {
        return Err(Failure::from(format!(
            "no certificates found under {} or {}",
            layout.pki_dir.display(),
            layout.kubeconfig_dir.display()
        )));
    }
    let now = time::OffsetDateTime::now_utc();
    print!("{}", offline::expiration_report(&inventory, &layout, now));
    Ok(ExitCode::SUCCESS)
}

fn renew(args: RenewArgs) -> Result<ExitCode, Failure> {
    let expires_in = super::ttl("--expires-in", &args.expires_in)?;
    let names: Vec<String> = if args.names.iter().any(|n| n == "all") {
        Vec::new()
    } else {
        for name in &args.names {
            if caretaker_agent_api::kubeadm::slot(name).is_none() {
                let known: Vec<_> = SLOTS.iter().map(|s| s.name).collect();
                return Err(Failure::from(format!(
                    "unknown certificate {name:?}; known: all, {}",
                    known.join(", ")
                )));
            }
        }
        args.names.clone()
    };
    super::create_dir("--state-dir", &args.state_dir)?;
    let layout = NodeLayout::new(args.dirs.pki_dir, args.dirs.kubeconfig_dir);
    let outcome = offline::renew(&layout, &args.state_dir, &args.ca_dir, &names, &expires_in)?;
    for name in &outcome.applied {
        println!("renewed {name}");
    }
    println!(
        "earliest expiry now {}; old files backed up in {}",
        outcome.earliest_not_after,
        outcome.backup_dir.display()
    );
    println!(
        "restart kube-apiserver, kube-controller-manager, kube-scheduler and etcd to use the new certificates"
    );
    Ok(ExitCode::SUCCESS)
}
