//! Per-Machine certificate refresh: the work a pass ([`refresh::plan`]) starts in the
//! background. An attempt reads the Machine fresh, talks to its agent and signs
//! (`refresh_node`), and records what [`refresh::after_attempt`] decides; that change wakes
//! the controller again through its watch.

use std::collections::BTreeMap;

use caretaker_agent_api::client::AgentError;
use caretaker_agent_api::kubeadm::{NodeRole, SigningCa};
use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest, PlanStatus, PlannedCertificate};
use caretaker_pki::Ttl;
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::{AcquireError, SemaphorePermit};

use crate::Error;
use crate::changes::AnnotationChanges;
use crate::context::Context;
use crate::credentials::ClusterCredentials;
use crate::machine::context::MachineAgent;
use crate::machine::handle::{MachineHandle, log_failed_call};
use crate::machine::refresh::{self, RefreshStep, RefreshWork, Refreshed};
use crate::machine::signing::{MachineIdentity, verified_role};
use crate::machine::{MachineView, ObjectRef};
use crate::metrics::CertificateKind;
use caretaker_api::names::{Operation, refresh_state};

const REFRESH: Operation = Operation::RefreshCertificates;

/// Runs a pass's refresh work in the background.
///
/// The work is boxed, and an expiry read boxed only once it has its turn: a spawned task is as
/// large as the largest future it awaits inline (an attempt's TLS, signing and writes, about
/// 12 KiB), and at start a thousand Machines' expiry reads wait for their turn at once.
pub(in crate::machine) async fn run(machine: MachineHandle, work: RefreshWork) {
    match work {
        RefreshWork::ObserveExpiry => {
            let turn = machine.ctx.expiry_reads.acquire().await;
            Box::pin(observe_expiry(&machine, turn)).await
        }
        RefreshWork::Attempt => Box::pin(attempt(machine)).await,
    }
}

/// Reads the earliest expiry of the node's certificates, on its `turn` of the bounded reads,
/// and records it.
async fn observe_expiry(machine: &MachineHandle, turn: Result<SemaphorePermit<'_>, AcquireError>) {
    let result = async {
        let inventory = {
            let _turn = turn;
            let agent = machine.ctx.agent_of(&machine.view).await?;
            agent.client.certificates(&agent.url).await?
        };
        let update = refresh::expiry_observed(inventory.earliest_expiry());
        machine.record(update).await.map(drop)
    }
    .await;
    if let Err(e) = result {
        // The next resync or Machine change tries again; a missing expiry is not an error state.
        tracing::info!(machine = %machine.view.name, error = %e, "cannot read the Machine's certificate expiry yet");
    }
}

/// Makes the attempt the Machine is at. The pass saw the controller's cache, which may lag
/// behind an attempt that just finished: the attempt is decided again on the Machine as the API
/// server has it (as the pass's own write just left it, or else read fresh), so no request is
/// worked on twice.
async fn attempt(machine: MachineHandle) {
    let (ctx, name) = (&machine.ctx, &machine.view.name);
    let fresh = match &machine.written {
        Some(written) => written.clone(),
        None => {
            let machines = ctx.api(
                &machine.view.namespace,
                &caretaker_api::cluster_api::machine_api_resource(),
            );
            match machines.get_opt(name).await {
                Ok(Some(object)) => MachineView::from_object(&object),
                Ok(None) => return,
                Err(e) => {
                    // The API server is unreachable; its watch will relist, and so reconcile,
                    // once back.
                    tracing::warn!(machine = %name, error = %e, "cannot read the Machine; the refresh is tried again later");
                    return;
                }
            }
        }
    };
    let RefreshStep::Attempt { ttl, attempt, .. } =
        refresh::decide(&fresh, OffsetDateTime::now_utc())
    else {
        return;
    };
    tracing::info!(machine = %name, attempt, "refreshing certificates");
    let mut written = fresh.clone();
    let outcome = refresh_node(ctx, &fresh, &ttl, &mut written).await;
    match &outcome {
        Ok(Refreshed::AgentBusy(why)) => {
            tracing::info!(machine = %name, reason = %why, "the agent is busy; waiting");
        }
        Err(e) => {
            log_failed_call(REFRESH, &fresh, attempt, e);
            ctx.metrics.rotation_failed(CertificateKind::Machine, e);
        }
        Ok(Refreshed::Done { .. }) => ctx.metrics.rotated(CertificateKind::Machine),
    }
    let now = OffsetDateTime::now_utc();
    let update = refresh::after_attempt(&fresh, attempt, outcome, now, &ctx.settings);
    let fresh = MachineHandle {
        view: fresh,
        written: Some(written),
        ..machine.clone()
    };
    if let Err(e) = fresh.record(update).await {
        tracing::warn!(machine = %name, error = %e, "cannot record the refresh result; it is resumed on the next reconcile");
    }
}

/// One attempt on the node: verify the Machine's role, plan on the node (or resume this
/// request's plan), decide how to sign every CSR from the operator's own table (refusing the
/// whole plan if any asks for more), sign, apply. `written` becomes the Machine as recording
/// the plan left it.
async fn refresh_node(
    ctx: &Context,
    view: &MachineView,
    ttl: &Ttl,
    written: &mut MachineView,
) -> Result<Refreshed, Error> {
    let credentials = ctx.credentials_for(view).await?;
    let MachineAgent { url, client: agent } = ctx.agent_of(view).await?;
    // One connection for the calls of this attempt, a few milliseconds apart. It is opened
    // (a handshake, no request) while the Machine's identity is read.
    let mut agent = agent.session(&url);
    let (identity, opened) = tokio::join!(machine_identity(ctx, view), agent.open());
    // Before any request is sent to the node: who the Machine is, as the Cluster API objects
    // say, and whether its cluster CA can sign for that long.
    let identity = identity?;
    let cluster_ca =
        credentials.authority(SigningCa::Cluster, &view.namespace, &view.cluster_name)?;
    refresh::check_ttl(ttl, OffsetDateTime::now_utc(), cluster_ca.info().not_after)?;
    opened?;

    // Resuming: an earlier attempt of this request made a plan. Continue it, or learn that it
    // was applied and only its recording was lost; never refresh the node twice.
    let resumed = match view.annotation(refresh_state::PLAN) {
        Some(plan_id) => match agent.plan_status(plan_id).await {
            Ok(PlanStatus::Applied { outcome }) => {
                return Ok(Refreshed::applied_earlier(&view.name, &outcome));
            }
            Ok(PlanStatus::Applying) => {
                return Ok(Refreshed::AgentBusy(format!(
                    "the agent is still applying plan {plan_id}"
                )));
            }
            Ok(PlanStatus::Staged { requests }) => Some((plan_id.to_string(), requests)),
            Err(AgentError::Status { status: 404, .. }) => None,
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    let (plan_id, requests) = match resumed {
        Some(resumed) => resumed,
        None => {
            let plan = agent.plan(&PlanRequest::default()).await?;
            let mut recorded = AnnotationChanges::default();
            recorded.set(refresh_state::PLAN, plan.plan_id.as_str());
            let object = ctx.patch_annotations(view, &recorded).await?;
            *written = MachineView::from_object(&object);
            (plan.plan_id, plan.requests)
        }
    };
    let certificates = sign(&credentials, &identity, view, ttl, &requests)?;
    let request = ApplyRequest {
        plan_id,
        certificates,
    };
    let outcome = agent.apply(&request).await?;
    Ok(Refreshed::applied(&view.name, &outcome))
}

/// Signs every CSR of a plan as the operator's table says, or none of them.
fn sign(
    credentials: &ClusterCredentials,
    identity: &MachineIdentity,
    view: &MachineView,
    ttl: &Ttl,
    requests: &[PlannedCertificate],
) -> Result<BTreeMap<String, String>, Error> {
    let decisions = identity
        .signing_plan(requests)
        .map_err(|refusal| Error::SigningRefused {
            machine: view.name.clone(),
            refusal,
        })?;
    let mut certificates = BTreeMap::new();
    for (decision, request) in decisions.iter().zip(requests) {
        let ca = credentials.authority(decision.ca, &view.namespace, &view.cluster_name)?;
        let signed = ca
            .sign_request(&request.csr_pem, &decision.policy, ttl)
            .map_err(|source| Error::SigningFailed {
                certificate: decision.name.clone(),
                source,
            })?;
        certificates.insert(decision.name.clone(), signed.certificate_pem);
    }
    Ok(certificates)
}

/// Who the Machine is for signing, from the Cluster API objects alone: its node and addresses,
/// its verified role, the Cluster's control-plane endpoint host and the extra SANs of its
/// CK8sControlPlane (any `extraSANs` list in its spec).
async fn machine_identity(ctx: &Context, view: &MachineView) -> Result<MachineIdentity, Error> {
    let node_name = view.node_name.clone().ok_or_else(|| Error::NoNode {
        machine: view.name.clone(),
    })?;
    let cluster = ctx
        .api(
            &view.namespace,
            &caretaker_api::cluster_api::cluster_api_resource(),
        )
        .get_opt(&view.cluster_name)
        .await?;
    let control_plane = cluster.as_ref().and_then(ObjectRef::control_plane_of);
    let role = verified_role(view, control_plane.as_ref())?;
    let endpoint_host = cluster.as_ref().and_then(|c| {
        c.data["spec"]["controlPlaneEndpoint"]["host"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_string)
    });
    let mut extra_sans = Vec::new();
    if let Some(reference) = control_plane.filter(|_| role == NodeRole::ControlPlane) {
        let planes = ctx.api(
            &view.namespace,
            &caretaker_api::cluster_api::control_plane_api_resource(),
        );
        if let Some(plane) = planes.get_opt(&reference.name).await? {
            collect_extra_sans(&plane.data["spec"], &mut extra_sans);
        }
    }
    Ok(MachineIdentity {
        machine: view.name.clone(),
        node_name,
        addresses: view.addresses.clone(),
        role,
        endpoint_host,
        extra_sans,
    })
}

fn collect_extra_sans(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if key == "extraSANs" {
                    out.extend(
                        child
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|s| s.as_str().map(str::to_string)),
                    );
                } else {
                    collect_extra_sans(child, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_extra_sans(i, out)),
        _ => {}
    }
}
