//! `caretaker pki` as a user runs it: real files in temp directories, real openssl.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{assert_one_error_line, caretaker, caretaker_command, path, stderr, stdout};

fn create_ca(dir: &Path) {
    let out = caretaker(&["pki", "ca", "create", "--out", path(dir), "--cn", "Test CA"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn ca_create_then_issue_gives_files_openssl_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, leaf) = (tmp.path().join("ca"), tmp.path().join("leaf"));
    create_ca(&ca);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&ca.join("ca.key")), 0o600);

    let out = issue(
        &ca,
        &leaf,
        &[
            "--cn",
            "node-1",
            "--dns",
            "node-1,localhost",
            "--ip",
            "10.0.0.1,::1",
            "--usage",
            "server",
            "--validity",
            "90d",
            "--algorithm",
            "rsa-2048",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&leaf.join("tls.key")), 0o600);

    let verify = Command::new("openssl")
        .args(["verify", "-purpose", "sslserver", "-CAfile"])
        .arg(ca.join("ca.crt"))
        .arg(leaf.join("tls.crt"))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        stdout(&verify) + &stderr(&verify)
    );

    // The key on disk belongs to the certificate on disk.
    let modulus = |args: &[&str], file: &Path| {
        let o = Command::new("openssl")
            .args(args)
            .arg(file)
            .output()
            .unwrap();
        assert!(o.status.success());
        o.stdout
    };
    assert_eq!(
        modulus(
            &["x509", "-noout", "-modulus", "-in"],
            &leaf.join("tls.crt")
        ),
        modulus(&["rsa", "-noout", "-modulus", "-in"], &leaf.join("tls.key"))
    );
}

/// `caretaker pki issue --ca CA --out OUT ARGS`, to run.
fn issue_command(ca: &Path, out: &Path, args: &[&str]) -> Command {
    let mut command = caretaker_command();
    command
        .args(["pki", "issue", "--ca", path(ca), "--out", path(out)])
        .args(args);
    command
}

/// Runs `caretaker pki issue --ca CA --out OUT ARGS`.
fn issue(ca: &Path, out: &Path, args: &[&str]) -> Output {
    issue_command(ca, out, args).output().unwrap()
}

/// Bad input: non-zero exit, exactly one line on stderr naming the value, nothing in --out.
fn assert_rejected(output: Output, out_dir: &Path, must_name: &str) {
    assert_one_error_line(&output, must_name);
    assert!(
        !out_dir.exists(),
        "{} must not be created",
        out_dir.display()
    );
}

#[test]
fn bad_input_is_one_clear_line_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = path(&out);
    // `pki ca create` with FLAG VALUE; the error names the value.
    let create = |flag: &str, value: &str| {
        let output = caretaker(&["pki", "ca", "create", "--out", o, flag, value]);
        assert_rejected(output, &out, value)
    };
    create("--algorithm", "dsa-1024");
    create("--validity", "-1y");
    create("--validity", "10yrs");
    create("--validity", "0s");
    create("--validity", "300y");

    // `pki issue` from the CA in `ca` with `extra` arguments; the error names `named`.
    let rejected = |ca: &Path, extra: &[&str], named: &str| {
        let args = [&["--cn", "x"], extra].concat();
        assert_rejected(issue(ca, &out, &args), &out, named)
    };
    rejected(&tmp.path().join("no-such-ca"), &[], "no-such-ca");

    let ca = tmp.path().join("ca");
    create_ca(&ca);
    rejected(&ca, &["--ip", "10.0.0.300"], "10.0.0.300");
    rejected(&ca, &["--usage", "peer"], "peer");
    rejected(&ca, &["--validity", "5x"], "5x");

    // A CA directory whose certificate is a leaf.
    let leaf = tmp.path().join("leaf");
    let issued = issue(&ca, &leaf, &["--cn", "leaf"]);
    assert!(issued.status.success());
    let fake_ca = tmp.path().join("fake-ca");
    std::fs::create_dir(&fake_ca).unwrap();
    std::fs::copy(leaf.join("tls.crt"), fake_ca.join("ca.crt")).unwrap();
    std::fs::copy(leaf.join("tls.key"), fake_ca.join("ca.key")).unwrap();
    rejected(&fake_ca, &[], "not a CA");
}

#[test]
fn existing_files_are_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    create_ca(&ca);
    let before = std::fs::read(ca.join("ca.key")).unwrap();
    let again = caretaker(&["pki", "ca", "create", "--out", path(&ca)]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );
    assert_eq!(std::fs::read(ca.join("ca.key")).unwrap(), before);
}

#[test]
fn inspect_prints_tables_json_bundles_and_kubeconfigs() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    let leaf = tmp.path().join("leaf");
    create_ca(&ca);
    let issued = issue(
        &ca,
        &leaf,
        &[
            "--cn",
            "system:admin",
            "--org",
            "system:masters",
            "--usage",
            "client",
        ],
    );
    assert!(issued.status.success(), "{}", stderr(&issued));

    let table = caretaker(&["pki", "inspect", path(&leaf.join("tls.crt"))]);
    assert!(table.status.success());
    let text = stdout(&table);
    assert!(text.contains("CN=system:admin"), "{text}");
    assert!(text.contains("clientAuth"), "{text}");
    assert!(
        text.contains("Issuer:") && text.contains("CN=Test CA"),
        "{text}"
    );

    // A bundle of two certificates.
    let bundle = tmp.path().join("bundle.pem");
    let pem = std::fs::read_to_string(ca.join("ca.crt")).unwrap()
        + &std::fs::read_to_string(leaf.join("tls.crt")).unwrap();
    std::fs::write(&bundle, pem).unwrap();
    let json = caretaker(&["pki", "inspect", "--json", path(&bundle)]);
    assert!(json.status.success(), "{}", stderr(&json));
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(parsed.as_array().unwrap().len(), 2);
    assert_eq!(parsed[0]["certificate"]["is_ca"], true);
    assert_eq!(
        parsed[1]["certificate"]["organizations"][0],
        "system:masters"
    );

    // A kubeconfig with the CA and the client certificate embedded, as kubeadm writes it.
    let b64 = |p: &Path| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap())
    };
    let kubeconfig = tmp.path().join("admin.conf");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://10.0.0.1:6443\n  name: kubernetes\nkind: Config\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&ca.join("ca.crt")),
            b64(&leaf.join("tls.crt")),
            b64(&leaf.join("tls.key")),
        ),
    )
    .unwrap();
    let json = caretaker(&["pki", "inspect", "--json", path(&kubeconfig)]);
    assert!(json.status.success(), "{}", stderr(&json));
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let fields: Vec<_> = parsed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["certificate-authority-data", "client-certificate-data"]
    );
    assert_eq!(parsed[1]["certificate"]["common_name"], "system:admin");
}

#[test]
fn inspect_refuses_a_private_key_without_printing_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    create_ca(&ca);
    let key = std::fs::read_to_string(ca.join("ca.key")).unwrap();
    let body = key.lines().nth(1).unwrap();

    // A certificate file with a key appended, and the key on its own.
    let mixed = tmp.path().join("mixed.pem");
    std::fs::write(
        &mixed,
        std::fs::read_to_string(ca.join("ca.crt")).unwrap() + &key,
    )
    .unwrap();
    for file in [mixed, ca.join("ca.key")] {
        for json in [false, true] {
            let mut args = vec!["pki", "inspect", path(&file)];
            if json {
                args.push("--json");
            }
            let out = caretaker(&args);
            assert!(!out.status.success(), "{args:?}");
            let all = stdout(&out) + &stderr(&out);
            assert!(all.contains("PRIVATE KEY"), "{all}");
            assert!(!all.contains(&body[..20]), "the key leaked: {all}");
        }
    }
}

#[test]
fn every_subcommand_explains_itself() {
    for args in [
        vec!["--help"],
        vec!["pki", "--help"],
        vec!["pki", "ca", "create", "--help"],
        vec!["pki", "issue", "--help"],
        vec!["pki", "inspect", "--help"],
        vec!["operator", "--help"],
        vec!["agent", "--help"],
        vec!["certs", "check-expiration", "--help"],
        vec!["certs", "renew", "--help"],
        vec!["apiserver", "--help"],
        vec!["demo", "--help"],
        vec!["status", "--help"],
        vec!["status", "cluster", "--help"],
        vec!["certs", "--help"],
        vec!["crds", "--help"],
    ] {
        let out = caretaker(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).contains("Usage:"), "{args:?}");
    }
}

#[test]
fn a_leaf_ends_with_its_ca_and_is_backdated_for_clock_skew_but_not_before_the_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, leaf) = (tmp.path().join("ca"), tmp.path().join("leaf"));
    let out = caretaker(&[
        "pki",
        "ca",
        "create",
        "--out",
        path(&ca),
        "--validity",
        "30d",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A client certificate from the CA in `ca` valid for `validity`, into `out`.
    let client = |ca: &Path, validity: &str, out: &Path| {
        let out = issue(
            ca,
            out,
            &["--cn", "x", "--usage", "client", "--validity", validity],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        out
    };
    let out = client(&ca, "1y", &leaf);
    assert!(
        stderr(&out).contains("--validity 1y reaches past the CA's expiry"),
        "{}",
        stderr(&out)
    );
    let info = |p: &Path| {
        let pem = std::fs::read_to_string(p).unwrap();
        caretaker_pki::CertificateInfo::from_pem(&pem).unwrap()
    };
    let (ca, leaf) = (info(&ca.join("ca.crt")), info(&leaf.join("tls.crt")));
    assert_eq!(leaf.not_after, ca.not_after, "cut to the CA's own expiry");
    // Backdated a few minutes for clocks behind ours, but never before the CA existed.
    assert!(leaf.not_before >= ca.not_before, "{leaf:?} / {ca:?}");
    let now = time::OffsetDateTime::now_utc();
    assert!(
        leaf.not_before < now - time::Duration::minutes(1),
        "backdated"
    );
    assert!(
        leaf.not_before > now - time::Duration::minutes(10),
        "by minutes, not more"
    );

    // A CA made a moment ago by a tool that does not backdate (openssl): backdating the leaf
    // by the usual minutes would start it before its CA, so it starts with the CA instead.
    let (fresh, fresh_leaf) = (tmp.path().join("fresh-ca"), tmp.path().join("fresh-leaf"));
    std::fs::create_dir(&fresh).unwrap();
    let openssl = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "30", "-subj", "/CN=fresh-ca"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(fresh.join("ca.key"))
        .arg("-out")
        .arg(fresh.join("ca.crt"))
        .output()
        .unwrap();
    assert!(openssl.status.success(), "{}", stderr(&openssl));
    client(&fresh, "1d", &fresh_leaf);
    let (ca, leaf) = (
        info(&fresh.join("ca.crt")),
        info(&fresh_leaf.join("tls.crt")),
    );
    assert!(
        ca.not_before > time::OffsetDateTime::now_utc() - time::Duration::minutes(2),
        "the CA must be younger than the backdating for this case: {ca:?}"
    );
    assert_eq!(leaf.not_before, ca.not_before, "not before the CA");
}

/// Issue 10: a write into `--out` that fails after the directory was made (EFBIG, with the
/// file size limit between the sizes of tls.crt and tls.key, so the certificate is staged and
/// the key is not) is one line naming the directory, and leaves nothing behind: neither
/// `--out` nor the parents this run created for it.
#[test]
fn a_failed_write_removes_the_directories_the_command_created() {
    use std::os::unix::process::CommandExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    create_ca(&ca);
    let rsa = |out: &Path| issue_command(&ca, out, &["--cn", "x", "--algorithm", "rsa-2048"]);
    // The sizes the files have.
    let sized = tmp.path().join("sized");
    let out = rsa(&sized).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let size = |name: &str| std::fs::metadata(sized.join(name)).unwrap().len();
    let (certificate, key) = (size("tls.crt"), size("tls.key"));
    assert!(certificate + 200 < key, "{certificate} / {key}");
    std::fs::remove_dir_all(&sized).unwrap();

    let created = tmp.path().join("new");
    let out_dir = created.join("parent").join("out");
    let limit = (certificate + key) / 2;
    let mut command = rsa(&out_dir);
    // SAFETY: setrlimit(2) and signal(2) are async-signal-safe and touch no memory of the
    // parent. An ignored SIGXFSZ stays ignored across exec, so a write past the limit fails
    // with EFBIG instead of killing the process.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = command.output().unwrap();
    let err = assert_one_error_line(&out, path(&out_dir));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("File too large"), "the write failed: {err}");
    assert!(
        err.contains(&format!("removed {}", path(&created))),
        "says what it removed: {err}"
    );
    assert!(
        !created.exists(),
        "{} is left behind: {:?}",
        created.display(),
        walk(&created)
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["ca"], "only the CA is left");
}

/// Every path below `dir`, to show what a failed run left behind.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        found.push(entry.path());
        found.extend(walk(&entry.path()));
    }
    found
}
