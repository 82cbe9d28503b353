//! `caretaker crds`: caretaker's CustomResourceDefinitions, generated from the operator's
//! Rust types, as YAML for `kubectl apply -f -`.

use std::io::Write;
use std::process::ExitCode;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Takes no options: there is one set of CRDs.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {}

pub fn run(_: CrdsArgs) -> ExitCode {
    super::run("crds", || {
        let text = yaml(&caretaker_api::v1alpha1::crds())?;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("cannot write to stdout: {e}"))?;
        Ok(ExitCode::SUCCESS)
    })
}

/// `crds` as one multi-document YAML stream, each document starting with `---`.
pub fn yaml(crds: &[CustomResourceDefinition]) -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(crd)?);
    }
    Ok(out)
}
