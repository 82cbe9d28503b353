//! deploy/ as the binary sees it: every flag the Deployment and the agent's systemd unit pass
//! is one the binary takes, and the ports the Deployment, its probes and its Service name are
//! the ones the operator listens on. (crates/operator/tests/deploy.rs installs the manifests on
//! an RBAC-enforcing API server and runs the operator with their permissions.)

mod common;

use std::path::{Path, PathBuf};

use common::{caretaker, stderr, stdout};
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file)
}

fn yaml(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy(file)).unwrap();
    serde_saphyr::from_str_multiple(&text).unwrap()
}

/// The `--flags` of `caretaker COMMAND --help`.
fn flags_of(command: &str) -> Vec<String> {
    let out = caretaker(&[command, "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.trim_end_matches([',', '.']).to_string())
        .collect()
}

#[test]
fn the_deployment_passes_only_flags_the_operator_takes_and_names_its_ports() {
    let deployment = &yaml("deployment.yaml")[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "operator");
    let known = flags_of("operator");
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            known.iter().any(|k| k == flag),
            "{flag} is not a flag of caretaker operator"
        );
    }
    assert!(args.contains(&"--leader-elect"));
    // CA Secrets are confined to caretaker's own namespace, the webhook bootstrap's.
    let after = |flag: &str| {
        let at = args.iter().position(|a| *a == flag);
        at.map(|i| args[i + 1])
            .unwrap_or_else(|| panic!("no {flag}"))
    };
    let bootstrap_namespace = after("--webhook-bootstrap").split('/').next().unwrap();
    assert_eq!(after("--authority-secret-namespaces"), bootstrap_namespace);
    let port = |name: &str| {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
            .as_i64()
            .unwrap()
    };
    // caretaker operator's defaults: --webhook-bind-address :9443, --metrics-bind-address
    // :8080, --health-probe-bind-address :8081.
    assert_eq!(
        (port("webhook"), port("metrics"), port("health")),
        (9443, 8080, 8081)
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(deployment["spec"]["replicas"], 2);
    // SIGTERM waits up to 30 s for running reconciles, and up to 5 s more for the Lease.
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_i64()
        .unwrap();
    assert!(grace > 35, "{grace}");

    let service = &yaml("service.yaml")[0];
    let target = |name: &str| {
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no Service port {name}"))
            .clone()
    };
    // The webhook configuration calls the Service on 443.
    assert_eq!(target("webhook")["port"], 443);
    assert_eq!(target("webhook")["targetPort"], "webhook");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
}

#[test]
fn the_agent_unit_passes_only_flags_the_agent_takes() {
    let unit = std::fs::read_to_string(deploy("agent/caretaker-agent.service")).unwrap();
    let exec = unit
        .split("ExecStart=")
        .nth(1)
        .expect("an ExecStart")
        .split("\n#")
        .next()
        .unwrap()
        .replace("\\\n", " ");
    let exec = exec.lines().next().unwrap();
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(&words[..2], ["/usr/local/bin/caretaker", "agent"]);
    let known = flags_of("agent");
    let flags: Vec<&&str> = words.iter().filter(|w| w.starts_with("--")).collect();
    assert!(flags.len() >= 4, "{exec}");
    for flag in flags {
        assert!(
            known.iter().any(|k| k == flag),
            "{flag} is not a flag of caretaker agent"
        );
    }
    for setting in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/etc/kubernetes",
    ] {
        assert!(unit.contains(setting), "{setting}");
    }
}
