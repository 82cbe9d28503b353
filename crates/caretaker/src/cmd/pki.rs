//! `caretaker pki`: bootstrap or debug a PKI by hand.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{Failure, ttl};
use base64::Engine as _;
use caretaker_pki::bundle::{self, BundleCertificate};
use caretaker_pki::files::{self, FileToWrite};
use caretaker_pki::{CaSpec, CertificateAuthority, CertificateInfo, KeyAlgorithm, LeafSpec, Usage};
use clap::{Args, Subcommand};
use time::OffsetDateTime;

#[derive(Debug, Subcommand)]
pub enum PkiCommand {
    /// Manage certificate authorities.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Issue a leaf certificate and key signed by a CA directory (ca.crt, ca.key).
    Issue(IssueArgs),
    /// Print certificates: PEM files, bundles, or the certificates inside a kubeconfig.
    ///
    /// Exits non-zero if a file holds anything but certificates (a private key, say) where
    /// certificates are expected; the offending block is named, never printed.
    Inspect(InspectArgs),
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a self-signed CA: writes DIR/ca.crt and DIR/ca.key (mode 0600).
    ///
    /// Refuses to overwrite existing files. On any error nothing is left in DIR.
    Create(CaCreateArgs),
}

const ALGORITHMS: &str = "ecdsa-p256 (default), ecdsa-p384, ed25519, rsa-2048, rsa-3072, rsa-4096";

#[derive(Debug, Args)]
pub struct CaCreateArgs {
    /// Directory to write ca.crt and ca.key into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Key algorithm: ecdsa-p256 (default), ecdsa-p384, ed25519, rsa-2048, rsa-3072, rsa-4096.
    #[arg(long, value_name = "ALGORITHM", default_value = "ecdsa-p256")]
    algorithm: String,
    /// How long the CA is valid (e.g. 10y, 5y6mo, 3650d).
    #[arg(
        long,
        value_name = "TTL",
        default_value = "10y",
        allow_hyphen_values = true
    )]
    validity: String,
    /// The CA's common name.
    #[arg(long, value_name = "NAME", default_value = "caretaker-ca")]
    cn: String,
    /// Maximum number of intermediate CAs below this one (0: it signs leaves only).
    #[arg(long, value_name = "N", default_value_t = 0)]
    path_len: u8,
}

#[derive(Debug, Args)]
pub struct IssueArgs {
    /// Directory holding the signing CA as ca.crt and ca.key.
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// The certificate's common name.
    #[arg(long, value_name = "NAME")]
    cn: String,
    /// Organizations (O=) of the subject, comma-separated (e.g. system:masters).
    #[arg(long = "org", value_name = "O,…", value_delimiter = ',')]
    organizations: Vec<String>,
    /// DNS subject alternative names, comma-separated.
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    dns: Vec<String>,
    /// IP subject alternative names, comma-separated.
    #[arg(long, value_name = "IP,…", value_delimiter = ',')]
    ip: Vec<String>,
    /// What the certificate is for: server, client or both.
    #[arg(long, value_name = "USAGE", default_value = "both")]
    usage: String,
    /// How long the certificate is valid (e.g. 90d, 1y); capped at the CA's own expiry.
    #[arg(
        long,
        value_name = "TTL",
        default_value = "1y",
        allow_hyphen_values = true
    )]
    validity: String,
    /// Key algorithm: ecdsa-p256 (default), ecdsa-p384, ed25519, rsa-2048, rsa-3072, rsa-4096.
    #[arg(long, value_name = "ALGORITHM", default_value = "ecdsa-p256")]
    algorithm: String,
    /// Directory to write tls.crt and tls.key (mode 0600) into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// PEM certificate or bundle files, or kubeconfigs.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(command: PkiCommand) -> ExitCode {
    super::run("pki", || match command {
        PkiCommand::Ca(CaCommand::Create(args)) => create_ca(args),
        PkiCommand::Issue(args) => issue(args),
        PkiCommand::Inspect(args) => inspect(args),
    })
}

fn algorithm(value: &str) -> Result<KeyAlgorithm, String> {
    value
        .parse()
        .map_err(|_| format!("invalid --algorithm {value:?}: accepted are {ALGORITHMS}"))
}

fn create_ca(args: CaCreateArgs) -> Result<ExitCode, Failure> {
    let spec = CaSpec {
        common_name: args.cn,
        validity: ttl("--validity", &args.validity)?,
        path_len: Some(args.path_len),
        algorithm: algorithm(&args.algorithm)?,
    };
    let ca = CertificateAuthority::create(&spec)?;
    let (cert, key) = (ca.certificate_pem(), ca.private_key_pem());
    write_out(
        &args.out,
        &[
            FileToWrite {
                name: "ca.crt",
                contents: cert.as_bytes(),
                mode: files::CERTIFICATE_MODE,
            },
            FileToWrite {
                name: "ca.key",
                contents: key.as_bytes(),
                mode: files::PRIVATE_KEY_MODE,
            },
        ],
    )?;
    println!(
        "wrote {} and {} ({}, {}, valid until {})",
        args.out.join("ca.crt").display(),
        args.out.join("ca.key").display(),
        ca.info().subject,
        ca.algorithm(),
        rfc3339(ca.info().not_after)
    );
    Ok(ExitCode::SUCCESS)
}

fn issue(args: IssueArgs) -> Result<ExitCode, Failure> {
    let usage: Usage = args.usage.parse().map_err(|_| {
        format!(
            "invalid --usage {:?}: accepted are server, client, both",
            args.usage
        )
    })?;
    let ip_addresses = args
        .ip
        .iter()
        .map(|ip| {
            ip.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("invalid --ip {ip:?}: not an IPv4 or IPv6 address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spec = LeafSpec {
        common_name: args.cn,
        organizations: args.organizations,
        dns_names: args.dns.into_iter().map(|d| d.trim().to_string()).collect(),
        ip_addresses,
        usage,
        validity: ttl("--validity", &args.validity)?,
        algorithm: algorithm(&args.algorithm)?,
    };
    let ca = load_ca(&args.ca)?;
    let issued = ca.issue(&spec)?;
    let key = issued
        .key
        .as_ref()
        .expect("issue() returns the new key")
        .to_pem();
    write_out(
        &args.out,
        &[
            FileToWrite {
                name: "tls.crt",
                contents: issued.certificate_pem.as_bytes(),
                mode: files::CERTIFICATE_MODE,
            },
            FileToWrite {
                name: "tls.key",
                contents: key.as_bytes(),
                mode: files::PRIVATE_KEY_MODE,
            },
        ],
    )?;
    println!(
        "wrote {} and {} ({}, signed by {}, valid until {})",
        args.out.join("tls.crt").display(),
        args.out.join("tls.key").display(),
        issued.info().subject,
        issued.info().issuer,
        rfc3339(issued.info().not_after)
    );
    if issued.capped_at_issuer {
        eprintln!(
            "caretaker pki: note: --validity {} reaches past the CA's expiry; the certificate \
             ends with the CA at {}",
            args.validity,
            rfc3339(issued.info().not_after)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn load_ca(dir: &Path) -> Result<CertificateAuthority, String> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read CA file {}: {e}", path.display()))
    };
    let (cert, key) = (read("ca.crt")?, read("ca.key")?);
    CertificateAuthority::from_pem(&cert, &key)
        .map_err(|e| format!("CA in {} is not usable: {e}", dir.display()))
}

/// Writes all files into `dir` or none: refuses to overwrite, and when the write fails removes
/// what this run created: `dir` and those of its parents that did not exist.
fn write_out(dir: &Path, files: &[FileToWrite<'_>]) -> Result<(), String> {
    for file in files {
        let path = dir.join(file.name);
        if path.exists() {
            return Err(format!(
                "{} already exists; refusing to overwrite it (remove it or choose another --out)",
                path.display()
            ));
        }
    }
    // The outermost of `dir` and its parents that is not there yet.
    let created = dir
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && is_missing(std::fs::symlink_metadata(p)))
        .last();
    let failed = |problem: String| {
        let Some(created) = created else {
            return problem;
        };
        match remove_created(dir, created, files) {
            Ok(()) => format!(
                "{problem}; removed {}, which it had created",
                created.display()
            ),
            Err(e) => format!(
                "{problem}; could not remove {}, which it had created: {e}",
                created.display()
            ),
        }
    };
    if created.is_some() {
        std::fs::create_dir_all(dir)
            .map_err(|e| failed(format!("cannot create --out {}: {e}", dir.display())))?;
    }
    files::write_all(dir, files)
        .map_err(|e| failed(format!("cannot write into {}: {e}", dir.display())))
}

fn is_missing<T>(result: std::io::Result<T>) -> bool {
    matches!(result, Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Undoes a failed [`write_out`] that created `created`: removes those of `files` that are in
/// `dir` already (a failure after one was renamed into place), then `dir` and its parents up to
/// `created`. Anything else found there is left, and the removal fails on its directory.
fn remove_created(dir: &Path, created: &Path, files: &[FileToWrite<'_>]) -> std::io::Result<()> {
    let tolerate_missing = |result: std::io::Result<()>| match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    for file in files {
        tolerate_missing(files::remove_file_securely(&dir.join(file.name)))?;
    }
    for made in dir.ancestors() {
        tolerate_missing(std::fs::remove_dir(made))?;
        if made == created {
            break;
        }
    }
    Ok(())
}

/// Where in a file a certificate came from.
struct Found {
    file: PathBuf,
    /// `None` for a PEM file; the kubeconfig field otherwise.
    field: Option<String>,
    index: usize,
    total: usize,
    info: CertificateInfo,
}

fn inspect(args: InspectArgs) -> Result<ExitCode, Failure> {
    let mut found = Vec::new();
    let mut failed = false;
    for file in &args.files {
        match certificates_in(file) {
            Ok(mut certificates) => found.append(&mut certificates),
            Err(message) => {
                eprintln!("caretaker pki: {}: {message}", file.display());
                failed = true;
            }
        }
    }
    if args.json {
        let entries: Vec<_> = found
            .iter()
            .map(|f| {
                serde_json::json!({
                    "file": f.file,
                    "field": f.field,
                    "index": f.index,
                    "certificate": f.info,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        let now = OffsetDateTime::now_utc();
        for f in &found {
            print!("{}", table(f, now));
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Kubeconfig fields that hold certificates, base64-encoded PEM.
const KUBECONFIG_CERTIFICATE_FIELDS: [&str; 2] =
    ["certificate-authority-data", "client-certificate-data"];

fn certificates_in(file: &Path) -> Result<Vec<Found>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read: {e}"))?;
    let mut sources: Vec<(Option<String>, String)> = Vec::new();
    if text.contains("-----BEGIN") {
        sources.push((None, text));
    } else {
        // A kubeconfig: the certificates are base64 PEM in well-known fields. Key fields
        // (client-key-data) are deliberately never read.
        for line in text.lines() {
            let line = line.trim().trim_start_matches("- ");
            let Some((field, value)) = line.split_once(':') else {
                continue;
            };
            if KUBECONFIG_CERTIFICATE_FIELDS.contains(&field.trim()) {
                let value = value.trim().trim_matches('"');
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(value)
                    .ok()
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or_else(|| format!("{} is not base64-encoded PEM", field.trim()))?;
                sources.push((Some(field.trim().to_string()), pem));
            }
        }
        if sources.is_empty() {
            return Err("no PEM certificates and no kubeconfig certificate fields found".into());
        }
    }
    let mut found = Vec::new();
    for (field, pem) in sources {
        let certificates = bundle::parse(&pem).map_err(|e| match &field {
            Some(field) => format!("{field}: {e}"),
            None => e.to_string(),
        })?;
        let total = certificates.len();
        for (i, certificate) in certificates.into_iter().enumerate() {
            found.push(Found {
                file: file.to_path_buf(),
                field: field.clone(),
                index: i + 1,
                total,
                info: BundleCertificate::info(&certificate).clone(),
            });
        }
    }
    Ok(found)
}

fn table(found: &Found, now: OffsetDateTime) -> String {
    let info = &found.info;
    let mut title = found.file.display().to_string();
    if let Some(field) = &found.field {
        let _ = write!(title, " ({field})");
    }
    if found.total > 1 {
        let _ = write!(title, " [certificate {} of {}]", found.index, found.total);
    }
    let join = |items: &[String]| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    let ips: Vec<String> = info.ip_addresses.iter().map(ToString::to_string).collect();
    let ca = match (info.is_ca, info.path_len) {
        (true, Some(n)) => format!("yes (path length {n})"),
        (true, None) => "yes".into(),
        (false, _) => "no".into(),
    };
    let rows = [
        ("Subject", info.subject.clone()),
        ("Issuer", info.issuer.clone()),
        ("Serial", info.serial.clone()),
        ("Not before", rfc3339(info.not_before)),
        (
            "Not after",
            format!(
                "{} ({})",
                rfc3339(info.not_after),
                residual(info.not_after, now)
            ),
        ),
        ("DNS names", join(&info.dns_names)),
        ("IP addresses", join(&ips)),
        ("CA", ca),
        ("Key usages", join(&info.key_usages)),
        ("Extended usages", join(&info.extended_key_usages)),
        ("Key algorithm", info.key_algorithm.clone()),
        (
            "Subject key ID",
            info.subject_key_id.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "Authority key ID",
            info.authority_key_id.clone().unwrap_or_else(|| "-".into()),
        ),
        ("SHA-256", info.sha256_fingerprint.clone()),
    ];
    let mut out = format!("{title}\n");
    for (label, value) in rows {
        let _ = writeln!(out, "  {:<17} {value}", format!("{label}:"));
    }
    out.push('\n');
    out
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// `in 364d` or `expired 3d ago`, like kubeadm's RESIDUAL TIME.
fn residual(not_after: OffsetDateTime, now: OffsetDateTime) -> String {
    let left = not_after - now;
    let describe = |d: time::Duration| {
        let d = d.abs();
        if d.whole_days() >= 1 {
            format!("{}d", d.whole_days())
        } else if d.whole_hours() >= 1 {
            format!("{}h", d.whole_hours())
        } else {
            format!("{}m", d.whole_minutes())
        }
    };
    if left.is_negative() {
        format!("expired {} ago", describe(left))
    } else {
        format!("in {}", describe(left))
    }
}
