//! `caretaker operator`: the controllers.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use caretaker_operator::leader::{Election, LeaseSettings};
use caretaker_operator::metrics::{self, serve_health, serve_metrics, serve_metrics_tls};
use caretaker_operator::replica;
use caretaker_operator::trust::package::DefaultPackage;
use caretaker_operator::trust::plan::{BundleMode, BundleSettings};
use caretaker_operator::webhook::bootstrap::{self, Bootstrap, WebhookUrl};
use caretaker_operator::webhook::{CertificateSource, Deprecations, Limits, Webhook};
use caretaker_operator::{BindAddress, Context, Settings, TrustSettings};
use caretaker_pki::PoolFilters;

use super::logging::{self, LogFormat};

/// `caretaker operator`'s flags; what the command does is in its help, on `Command::Operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    kubeconfig: super::KubeconfigArg,
    /// Port of the agents, for Machines without a caretaker.dev/agent-endpoint annotation.
    #[arg(long, value_name = "PORT", default_value_t = 9443)]
    agent_port: u16,
    /// Watch only this namespace.
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// The only namespaces a CertificateAuthority's CA Secret may be in (comma-separated), as
    /// cert-manager keeps ClusterIssuers' Secrets in its cluster resource namespace: a
    /// CertificateAuthority naming another is refused (NamespaceNotAllowed) and nothing is
    /// written. Any namespace when absent. deploy/ sets it to caretaker's own namespace.
    #[arg(long, value_name = "NS,NS,...", value_delimiter = ',', value_parser = namespace_name)]
    authority_secret_namespaces: Option<Vec<String>>,
    /// Attempts per request before it ends `failed`.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// First retry delay; it doubles after each failed attempt (e.g. 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration)]
    retry_base: Duration,
    /// How long one call to an agent may take (e.g. 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::duration)]
    agent_timeout: Duration,
    /// How often a running in-place upgrade is read from its agent (e.g. 2s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = super::duration)]
    upgrade_poll: Duration,
    /// Where the admission webhook listens (HTTPS): HOST:PORT, [IPv6]:PORT, or :PORT for every
    /// address; 0 turns it off. It is served only with --webhook-secret, --webhook-cert-path or
    /// --webhook-bootstrap.
    #[arg(long, value_name = "ADDRESS", default_value = ":9443", value_parser = listen)]
    webhook_bind_address: Listen,
    /// The webhook's serving certificate and key: the tls.crt and tls.key of this
    /// kubernetes.io/tls Secret, watched. A new certificate is served from the next handshake
    /// on; an unusable or deleted Secret keeps the last good one; until the Secret holds a good
    /// one, handshakes are refused.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = namespaced_name, conflicts_with = "webhook_cert_path")]
    webhook_secret: Option<(String, String)>,
    /// Instead of --webhook-secret and --webhook-cert-path: the webhook's certificates made by
    /// caretaker itself, for the operator running in NAMESPACE behind the Service SERVICE
    /// (e.g. caretaker-system/caretaker-webhook). At start, each of these that is absent is
    /// created, and each that exists is left as it is: the Namespace; the
    /// CertificateAuthority caretaker-webhook (Secret caretaker-webhook-ca, bundle ConfigMap
    /// caretaker-webhook-ca-bundle, in NAMESPACE); the IssuedCertificate caretaker-webhook in
    /// NAMESPACE for SERVICE.NAMESPACE.svc and SERVICE.NAMESPACE.svc.cluster.local, written to
    /// the Secret caretaker-webhook-tls; and the ValidatingWebhookConfiguration
    /// caretaker-webhook (Service port 443, or --webhook-url), annotated
    /// caretaker.dev/inject-ca-from: caretaker-webhook, its caBundle filled by injection. The
    /// webhook serves from NAMESPACE/caretaker-webhook-tls. Until the caretaker.dev CRDs are
    /// installed it says so once and waits for them.
    #[arg(
        long,
        value_name = "NAMESPACE/SERVICE",
        value_parser = namespaced_name,
        conflicts_with_all = ["webhook_secret", "webhook_cert_path"]
    )]
    webhook_bootstrap: Option<(String, String)>,
    /// With --webhook-bootstrap: the API server calls the webhook at this https://HOST:PORT
    /// (the webhook's paths appended) instead of through the Service, for an API server
    /// outside the cluster's network; the certificate also names HOST.
    #[arg(long, value_name = "URL", requires = "webhook_bootstrap")]
    webhook_url: Option<WebhookUrl>,
    /// Instead of --webhook-secret: the directory of the webhook's certificate and key files
    /// (PEM), read once at start.
    #[arg(long, value_name = "DIR")]
    webhook_cert_path: Option<PathBuf>,
    /// The certificate file in --webhook-cert-path, leaf first.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "tls.crt",
        requires = "webhook_cert_path"
    )]
    webhook_cert_name: String,
    /// The private key file in --webhook-cert-path.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "tls.key",
        requires = "webhook_cert_path"
    )]
    webhook_cert_key: String,
    /// Where /metrics is served, in the Prometheus (OpenMetrics) text format, over plain HTTP
    /// unless --metrics-cert-path: HOST:PORT, [IPv6]:PORT, or :PORT for every address; 0 turns
    /// it off. It holds no secret (counts, durations, expiry dates, object names); bind it to
    /// 127.0.0.1:PORT where only a scraper on the same host may read it.
    #[arg(long, value_name = "ADDRESS", default_value = ":8080", value_parser = listen)]
    metrics_bind_address: Listen,
    /// Serve /metrics over mutual TLS instead, with the certificate and key of this directory
    /// (tls.crt, leaf first, and tls.key; PEM, read once at start); requires
    /// --metrics-client-ca.
    #[arg(long, value_name = "DIR", requires = "metrics_client_ca")]
    metrics_cert_path: Option<PathBuf>,
    /// With --metrics-cert-path: the CA bundle (PEM) that scrapers' client certificates must
    /// chain to; a client without such a certificate gets nothing but a TLS alert.
    #[arg(long, value_name = "FILE", requires = "metrics_cert_path")]
    metrics_client_ca: Option<PathBuf>,
    /// Where the kubelet's probes are answered, over plain HTTP: /healthz (200 while the
    /// process runs) and /readyz (200 once the operator's caches of Machines and
    /// MachineDeployments have synced, 503 before); 0 turns them off.
    #[arg(long, value_name = "ADDRESS", default_value = ":8081", value_parser = listen)]
    health_probe_bind_address: Listen,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    trust: TrustArgs,
}

/// Leader election, for running several replicas.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Leader election")]
struct LeaderArgs {
    /// Reconcile only while holding the Lease (coordination.k8s.io/v1) named by
    /// --leader-election-id. Until then the replica stands by: it serves the webhook, /metrics
    /// and the probes (/readyz answers 200), and takes the Lease once its holder has not
    /// renewed it for --leader-election-lease-duration. A holder that has not renewed it for
    /// two thirds of that (its renew deadline, on its own clock, whatever a stalled call is
    /// doing) stops (exit status 1) and comes back as a standby; SIGTERM gives the Lease up at
    /// once.
    #[arg(long)]
    leader_elect: bool,
    /// The Lease's namespace: by default $POD_NAMESPACE, else the namespace of
    /// --webhook-bootstrap, else caretaker-system.
    #[arg(long, value_name = "NAMESPACE", requires = "leader_elect")]
    leader_election_namespace: Option<String>,
    /// The Lease's name.
    #[arg(long, value_name = "NAME", default_value = caretaker_operator::leader::DEFAULT_LEASE)]
    leader_election_id: String,
    /// How long a Lease its holder has not renewed stays its own (whole seconds, at least 2s).
    /// The holder renews every 2s (or a fifth of the renew deadline, if shorter) and stops
    /// reconciling two thirds of it after the start of its last successful renewal.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = super::duration)]
    leader_election_lease_duration: Duration,
}

/// trust-manager's flags, with its names and defaults, for the Bundle and ClusterBundle
/// controllers.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Bundles and ClusterBundles (trust-manager)")]
struct TrustArgs {
    /// How Bundles (trust.cert-manager.io/v1alpha1) are served. serve: as trust-manager serves
    /// them, each writing its own targets. migrate: each Bundle is applied as the ClusterBundle
    /// (trust-manager.io/v1alpha2) of its name, with the field manager the Bundle was applied
    /// with and no owner reference; that ClusterBundle takes the Bundle's targets over in one
    /// write each, and the Bundle's status mirrors the ClusterBundle's. Deleting a Bundle, or
    /// the Bundle CRD, then deletes no ClusterBundle and no target. The webhook warns of every
    /// Bundle write that Bundle is deprecated.
    #[arg(long, value_enum, default_value_t = BundleModeArg::Serve)]
    bundle_mode: BundleModeArg,
    /// The only namespace Bundle sources (ConfigMaps and Secrets) are read from.
    #[arg(long, value_name = "NAMESPACE", default_value = "cert-manager")]
    trust_namespace: String,
    /// The default CA package (trust-manager's JSON format: name, bundle, version) that
    /// `useDefaultCAs: true` adds; the file name must end in .json. Read once at start; a bad
    /// package stops the operator.
    #[arg(
        long,
        value_name = "FILE.json",
        conflicts_with = "default_package_from_system"
    )]
    default_package_location: Option<PathBuf>,
    /// Instead of --default-package-location: the default CAs are this machine's CA store
    /// ($SSL_CERT_FILE, else the distribution's bundle, e.g. /etc/ssl/certs/ca-certificates.crt).
    #[arg(long)]
    default_package_from_system: bool,
    /// Allow Bundles and ClusterBundles to write Secret targets (spec.target.secret).
    #[arg(long)]
    secret_targets_enabled: bool,
    /// Leave certificates whose notAfter has passed out of every bundle.
    #[arg(long)]
    filter_expired_certificates: bool,
    /// Leave certificates that are not CAs (no basicConstraints CA:TRUE) out of every bundle.
    #[arg(long)]
    filter_non_ca_certs: bool,
    /// Write targets only to these namespaces (comma-separated); all namespaces when absent.
    #[arg(long, value_name = "NS,NS,...", value_delimiter = ',')]
    target_namespaces: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BundleModeArg {
    Serve,
    Migrate,
}

impl TrustArgs {
    fn settings(&self) -> Result<TrustSettings, String> {
        let default_package = if let Some(path) = &self.default_package_location {
            Some(
                DefaultPackage::load(path)
                    .map_err(|e| format!("--default-package-location: {e}"))?,
            )
        } else if self.default_package_from_system {
            Some(
                DefaultPackage::from_system()
                    .map_err(|e| format!("--default-package-from-system: {e}"))?,
            )
        } else {
            None
        };
        Ok(TrustSettings {
            namespace: self.trust_namespace.clone(),
            bundles: BundleSettings {
                mode: match self.bundle_mode {
                    BundleModeArg::Serve => BundleMode::Serve,
                    BundleModeArg::Migrate => BundleMode::Migrate,
                },
                secret_targets_enabled: self.secret_targets_enabled,
                target_namespaces: self
                    .target_namespaces
                    .as_ref()
                    .map(|n| n.iter().cloned().collect()),
            },
            filters: PoolFilters {
                expired: self.filter_expired_certificates,
                non_ca: self.filter_non_ca_certs,
            },
            default_package,
        })
    }
}

/// `--webhook-bind-address`, `--metrics-bind-address`, `--health-probe-bind-address`: an
/// address, or 0 for none.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listen {
    Off,
    On(BindAddress),
}

fn listen(value: &str) -> Result<Listen, String> {
    match value {
        "0" => Ok(Listen::Off),
        address => address.parse().map(Listen::On),
    }
}

/// `NAMESPACE/NAME`.
/// A namespace name, as Kubernetes accepts it (an RFC 1123 label).
fn namespace_name(value: &str) -> Result<String, String> {
    let label = value.len() <= 63
        && !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    match label {
        true => Ok(value.to_string()),
        false => Err(format!(
            "{value:?} is not a namespace name (lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit)"
        )),
    }
}

fn namespaced_name(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_string(), name.to_string()))
        }
        _ => Err("expected NAMESPACE/NAME".into()),
    }
}

/// A listener on `address` for the server `flag` places, or `None` when it is off.
async fn bind(flag: &str, address: &Listen) -> Result<Option<tokio::net::TcpListener>, String> {
    match address {
        Listen::Off => {
            tracing::info!("{flag} 0: not served");
            Ok(None)
        }
        Listen::On(address) => address
            .listen()
            .await
            .map(Some)
            .map_err(|e| format!("{flag}: cannot listen on {address}: {e}")),
    }
}

/// Runs `server` if there is one; otherwise never ends.
async fn serve_if(server: Option<impl Future<Output = ()>>) {
    match server {
        Some(server) => server.await,
        None => std::future::pending().await,
    }
}

impl OperatorArgs {
    /// The mutual TLS of `/metrics`, if asked for; files that cannot serve stop the operator at
    /// start.
    fn metrics_tls(&self) -> Result<Option<metrics::TlsConfig>, String> {
        let (Some(dir), Some(client_ca)) = (&self.metrics_cert_path, &self.metrics_client_ca)
        else {
            return Ok(None);
        };
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let (certificate, key, client_ca) = (
            read(&dir.join("tls.crt"))?,
            read(&dir.join("tls.key"))?,
            read(client_ca)?,
        );
        metrics::mutual_tls(&certificate, &key, &client_ca).map(Some)
    }

    /// What --leader-elect asks for, if anything.
    fn lease(&self) -> Option<LeaseSettings> {
        if !self.leader.leader_elect {
            return None;
        }
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let namespace = self
            .leader
            .leader_election_namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE"))
            .or_else(|| self.webhook_bootstrap.as_ref().map(|(ns, _)| ns.clone()))
            .unwrap_or_else(|| "caretaker-system".into());
        let base = env("POD_NAME")
            .or_else(|| env("HOSTNAME"))
            .unwrap_or_else(|| "caretaker".into());
        Some(LeaseSettings {
            namespace,
            name: self.leader.leader_election_id.clone(),
            identity: LeaseSettings::identity(&base),
            duration: self.leader.leader_election_lease_duration,
        })
    }

    /// What --webhook-bootstrap asks for, if anything.
    fn webhook_bootstrap(&self) -> Option<Bootstrap> {
        let (namespace, service) = self.webhook_bootstrap.clone()?;
        Some(Bootstrap {
            namespace,
            service,
            url: self.webhook_url.clone(),
        })
    }

    /// Where the webhook's certificate comes from, if from anywhere.
    fn webhook_certificate(&self) -> Option<CertificateSource> {
        if let Some(bootstrap) = self.webhook_bootstrap() {
            return Some(bootstrap.certificate_source());
        }
        if let Some((namespace, name)) = &self.webhook_secret {
            return Some(CertificateSource::Secret {
                namespace: namespace.clone(),
                name: name.clone(),
            });
        }
        let dir = self.webhook_cert_path.as_ref()?;
        Some(CertificateSource::Files {
            certificate: dir.join(&self.webhook_cert_name),
            key: dir.join(&self.webhook_cert_key),
        })
    }
}

pub fn run(args: OperatorArgs) -> ExitCode {
    caretaker_operator::process::cap_malloc_arenas();
    logging::init(args.log_format);
    caretaker_operator::process::return_free_memory();
    let mut settings = Settings {
        agent_port: args.agent_port,
        max_attempts: args.max_attempts,
        retry_base: args.retry_base,
        agent_timeout: args.agent_timeout,
        upgrade_poll: args.upgrade_poll,
        authority_secret_namespaces: (args.authority_secret_namespaces.as_ref())
            .map(|n| n.iter().cloned().collect()),
        ..Settings::default()
    };
    super::run_async("operator", async move {
        settings.trust = args.trust.settings()?;
        // Its objects live in NAMESPACE: an operator watching another namespace would never
        // issue its certificate.
        if let (Some((bootstrap, _)), Some(watched)) = (&args.webhook_bootstrap, &args.namespace)
            && bootstrap != watched
        {
            return Err(format!(
                "--webhook-bootstrap {bootstrap}/…: the namespace must be the one --namespace \
                 watches ({watched})"
            )
            .into());
        }
        // Its CA Secret lives in NAMESPACE too.
        if let (Some((bootstrap, _)), Some(allowed)) = (
            &args.webhook_bootstrap,
            &settings.authority_secret_namespaces,
        ) && !allowed.contains(bootstrap)
        {
            return Err(format!(
                "--webhook-bootstrap {bootstrap}/…: its CA Secret would be in {bootstrap}, which \
                 --authority-secret-namespaces leaves out"
            )
            .into());
        }
        let client = args.kubeconfig.client().await?;
        let webhook = match (&args.webhook_bind_address, args.webhook_certificate()) {
            (Listen::Off, _) => {
                tracing::info!("admission webhook off (--webhook-bind-address 0)");
                None
            }
            (Listen::On(_), None) => {
                tracing::info!(
                    "admission webhook not served: no --webhook-secret, --webhook-cert-path \
                     or --webhook-bootstrap"
                );
                None
            }
            (Listen::On(address), Some(source)) => Some(
                Webhook::bind(address, source, Limits::default())
                    .await
                    .map_err(|e| format!("admission webhook: {e}"))?
                    .warning_of(Deprecations {
                        bundles: args.trust.bundle_mode == BundleModeArg::Migrate,
                    }),
            ),
        };
        let metrics_listener = bind("--metrics-bind-address", &args.metrics_bind_address).await?;
        let metrics_tls = args
            .metrics_tls()
            .map_err(|e| format!("--metrics-cert-path: {e}"))?;
        let health_listener = bind(
            "--health-probe-bind-address",
            &args.health_probe_bind_address,
        )
        .await?;
        tracing::info!(namespace = ?args.namespace, "operator starting");
        let webhook = serve_if(webhook.map(|webhook| webhook.run(client.clone())));
        // The bootstrap's objects, made while the webhook already waits for its Secret.
        let bootstrap = serve_if(
            args.webhook_bootstrap()
                .filter(|_| args.webhook_bind_address != Listen::Off)
                .map(|bootstrap| {
                    let client = client.clone();
                    async move {
                        let objects = bootstrap.objects();
                        bootstrap::ensure(client, &objects, Duration::from_secs(2)).await;
                        std::future::pending::<()>().await
                    }
                }),
        );
        let ctx = Context::new(client.clone(), settings);
        let limits = metrics::Limits::default();
        let metrics = serve_if(metrics_listener.map(|listener| {
            let metrics = ctx.metrics.clone();
            async move {
                match metrics_tls {
                    Some(tls) => serve_metrics_tls(listener, metrics, limits, tls).await,
                    None => serve_metrics(listener, metrics, limits).await,
                }
            }
        }));
        let health = serve_if(
            health_listener.map(|listener| serve_health(listener, ctx.readiness.clone(), limits)),
        );
        // Every replica serves these, leading or not; none of them ends by itself.
        let servers = async {
            tokio::select! {
                _ = webhook => {}
                _ = bootstrap => {}
                _ = metrics => {}
                _ = health => {}
            }
        };
        tokio::pin!(servers);
        let election = match args.lease() {
            None => None,
            Some(lease) => {
                tracing::info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "standing by for the leader Lease");
                Some(Election::join(client.clone(), lease).await?)
            }
        };
        let replica = replica::run(
            ctx,
            args.namespace.clone(),
            election,
            super::stop_requested(),
        );
        tokio::select! {
            stopped = replica => stopped?,
            () = &mut servers => return Ok(ExitCode::FAILURE),
        }
        Ok(ExitCode::SUCCESS)
    })
}
