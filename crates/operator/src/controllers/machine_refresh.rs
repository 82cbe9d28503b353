//! Per-Machine certificate refresh: the kube-rs glue that observes Machines, asks
//! [`crate::machine::refresh::decide`] what to do, and carries it out. Long work (talking to an
//! agent) runs in a spawned task; its result is written to the Machine's annotations, whose
//! change wakes the controller again through its watch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use caretaker_agent_api::client::AgentError;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest, PlanStatus};
use caretaker_pki::Ttl;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{Next, busy, busy_wait_changes, failure_reason, retry_changes};
use crate::Error;
use crate::context::{Context, EventType, MachineAgent};
use crate::machine::refresh::{RefreshStep, decide, format_time};
use crate::machine::{self, MachineView, ObjectRef};
use crate::names::{self, refresh_state};
use crate::signing::{MachineIdentity, verified_role};

/// How often an unreadable expiry is tried again.
const OBSERVE_RETRY: Duration = Duration::from_secs(60);

/// The refresh part of a Machine reconcile.
pub async fn reconcile(
    object: &Arc<DynamicObject>,
    view: &MachineView,
    ctx: &Arc<Context>,
) -> Result<Next, Error> {
    let (object, view, ctx) = (object.clone(), view.clone(), ctx.clone());
    let now = OffsetDateTime::now_utc();
    match decide(&view, now) {
        RefreshStep::Idle | RefreshStep::WaitForNode => Ok(Next::AwaitChange),
        RefreshStep::Backoff { until } => Ok(Next::at(until, now)),
        RefreshStep::ForgetEndedRequest => {
            let changes = BTreeMap::from([(refresh_state::TRIGGER.to_string(), Value::Null)]);
            ctx.patch_annotations(&view, changes).await?;
            Ok(Next::AwaitChange)
        }
        RefreshStep::Reject { trigger, reason } => {
            fail(&ctx, &object, &view, &trigger, &reason).await?;
            Ok(Next::AwaitChange)
        }
        RefreshStep::Start { trigger } => {
            let mut changes = clear_bookkeeping();
            changes.insert(
                names::REFRESH_CERTIFICATES_STATUS.into(),
                json!(names::STATUS_IN_PROGRESS),
            );
            changes.insert(refresh_state::TRIGGER.into(), json!(trigger));
            changes.insert(refresh_state::STARTED_AT.into(), json!(format_time(now)));
            changes.insert(refresh_state::ATTEMPTS.into(), json!("0"));
            ctx.patch_annotations(&view, changes.clone()).await?;
            // Start the first attempt now rather than one watch round trip later.
            let mut started = view.clone();
            for (key, value) in changes {
                match value.as_str() {
                    Some(text) => started.annotations.insert(key, text.to_string()),
                    None => started.annotations.remove(&key),
                };
            }
            let ttl: Ttl = trigger.parse().expect("Start follows a TTL that parses");
            let spawned = ctx.spawn_for("refresh", &started, {
                let (ctx, object, view) = (ctx.clone(), object.clone(), started.clone());
                async move { attempt_refresh(&ctx, &object, &view, ttl, 1).await }
            });
            let note = format!(
                "refreshing certificates of Machine {} with TTL {trigger}",
                view.name
            );
            ctx.machine_event(
                &object,
                EventType::Normal,
                names::EVENT_REFRESH_IN_PROGRESS,
                note,
            )
            .await;
            Ok(if spawned {
                Next::AwaitChange
            } else {
                busy(&ctx, "refresh", &view)
            })
        }
        RefreshStep::ObserveExpiry => {
            let started = ctx.spawn_for("refresh", &view, {
                let (ctx, view) = (ctx.clone(), view.clone());
                async move { observe_expiry(&ctx, &view).await }
            });
            // A success patches the Machine (and so wakes us); a failure does not: look again.
            Ok(if started {
                Next::After(ctx.settings.retry_base.max(OBSERVE_RETRY))
            } else {
                busy(&ctx, "refresh", &view)
            })
        }
        RefreshStep::Attempt { ttl, attempt, .. } => {
            let started = ctx.spawn_for("refresh", &view, {
                let (ctx, view, object) = (ctx.clone(), view.clone(), object.clone());
                async move { attempt_refresh(&ctx, &object, &view, ttl, attempt).await }
            });
            Ok(if started {
                Next::AwaitChange
            } else {
                busy(&ctx, "refresh", &view)
            })
        }
    }
}

async fn observe_expiry(ctx: &Context, view: &MachineView) {
    let result = async {
        let agent = ctx.agent_of(view).await?;
        let inventory = agent.client.certificates(&agent.url).await?;
        if let Some(expiry) = inventory.earliest_expiry() {
            let mut changes = BTreeMap::new();
            changes.insert(
                names::CERTIFICATES_EXPIRY.to_string(),
                json!(format_time(expiry)),
            );
            ctx.patch_annotations(view, changes).await?;
        }
        Ok::<_, Error>(())
    }
    .await;
    if let Err(e) = result {
        // The next resync or Machine change tries again; a missing expiry is not an error state.
        tracing::info!(machine = %view.name, error = %e, "cannot read the Machine's certificate expiry yet");
    }
}

async fn attempt_refresh(
    ctx: &Context,
    object: &DynamicObject,
    view: &MachineView,
    ttl: Ttl,
    attempt: u32,
) {
    // The reconcile saw the controller's cache, which may lag behind an attempt that just
    // finished. Decide again on the Machine as the API server has it, so no request is worked
    // on twice.
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &view.namespace,
        &machine::api_resource(),
    );
    let fresh = match api.get_opt(&view.name).await {
        Ok(Some(object)) => MachineView::from_object(&object),
        Ok(None) => return,
        Err(e) => {
            // The API server is unreachable; its watch will relist, and so reconcile, once back.
            tracing::warn!(machine = %view.name, error = %e, "cannot read the Machine; the refresh is tried again later");
            return;
        }
    };
    if !matches!(
        decide(&fresh, OffsetDateTime::now_utc()),
        RefreshStep::Attempt { .. }
    ) {
        return;
    }
    let view = &fresh;
    tracing::info!(machine = %view.name, attempt, "refreshing certificates");
    let outcome = refresh(ctx, view, &ttl).await;
    let result = match outcome {
        Ok(Refreshed::AgentBusy(why)) => wait_for_agent(ctx, view, &why).await,
        Err(Error::Agent(e)) if e.is_busy() => wait_for_agent(ctx, view, &e.to_string()).await,
        Ok(Refreshed::Done { expiry, note }) => {
            let mut changes = clear_bookkeeping();
            changes.insert(names::REFRESH_CERTIFICATES.into(), Value::Null);
            changes.insert(
                names::REFRESH_CERTIFICATES_STATUS.into(),
                json!(names::STATUS_DONE),
            );
            changes.insert(
                names::CERTIFICATES_EXPIRY.into(),
                json!(format_time(expiry)),
            );
            let worked = view.annotation(names::REFRESH_CERTIFICATES);
            let recorded = ctx
                .record_end(view, names::REFRESH_CERTIFICATES, worked, changes)
                .await;
            if let Ok(true) = recorded {
                ctx.machine_event(object, EventType::Normal, names::EVENT_REFRESH_DONE, note)
                    .await;
            }
            recorded.map(|_| ())
        }
        Err(e) if e.is_transient() && attempt < ctx.settings.max_attempts => {
            tracing::warn!(machine = %view.name, attempt, error = %e, "refresh attempt failed; will retry");
            let changes = retry_changes(refresh_state::RETRY, attempt, ctx.settings.retry_base, &e);
            ctx.patch_annotations(view, changes).await
        }
        Err(e) => {
            let trigger = view
                .annotation(names::REFRESH_CERTIFICATES)
                .unwrap_or_default()
                .to_string();
            let reason = failure_reason(&view.name, attempt, &e);
            fail(ctx, object, view, &trigger, &reason).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(machine = %view.name, error = %e, "cannot record the refresh result; it is resumed on the next reconcile");
    }
}

/// The node is busy with this request's (or another) refresh step: look again later, with a
/// backoff that grows with how long the request has run. Not a failed attempt.
async fn wait_for_agent(ctx: &Context, view: &MachineView, why: &str) -> Result<(), Error> {
    tracing::info!(machine = %view.name, reason = why, "the agent is busy; waiting");
    let started_at = view.annotation(refresh_state::STARTED_AT);
    let changes = busy_wait_changes(refresh_state::RETRY, started_at, why);
    ctx.patch_annotations(view, changes).await
}

/// What an attempt achieved.
enum Refreshed {
    /// New certificates are in place: their earliest expiry and a note for the event.
    Done {
        expiry: OffsetDateTime,
        note: String,
    },
    /// The node is still applying this request's plan: wait for it, never apply again.
    AgentBusy(String),
}

/// Ends the Machine's request `failed` with `reason`, and says so in a Warning event once that
/// is recorded.
async fn fail(
    ctx: &Context,
    object: &DynamicObject,
    view: &MachineView,
    trigger: &str,
    reason: &str,
) -> Result<(), Error> {
    let worked = Some(trigger).filter(|t| !t.is_empty());
    let changes = annotations_failed(trigger, reason);
    if !ctx
        .record_end(view, names::REFRESH_CERTIFICATES, worked, changes)
        .await?
    {
        return Ok(());
    }
    ctx.machine_event(
        object,
        EventType::Warning,
        names::EVENT_REFRESH_FAILED,
        reason.to_string(),
    )
    .await;
    Ok(())
}

/// One attempt: verify the Machine's role, plan on the node, decide how to sign every CSR from
/// the operator's own table (refusing the whole plan if any asks for more), sign, apply.
async fn refresh(ctx: &Context, view: &MachineView, ttl: &Ttl) -> Result<Refreshed, Error> {
    // Before anything is sent to the node: who the Machine is, as the Cluster API objects say.
    let identity = machine_identity(ctx, view).await?;
    let credentials = ctx.credentials_for(view).await?;
    let cluster_ca = credentials.authority(
        caretaker_agent_api::kubeadm::SigningCa::Cluster,
        &view.namespace,
        &view.cluster_name,
    )?;
    let now = OffsetDateTime::now_utc();
    let wanted = ttl
        .expires_at(now)
        .ok_or_else(|| Error::Invalid(format!("TTL {ttl} reaches past the year 9999")))?;
    if wanted > cluster_ca.info().not_after {
        return Err(Error::Invalid(format!(
            "TTL {ttl} reaches past the cluster CA's own expiry ({}); nothing was sent to the node",
            format_time(cluster_ca.info().not_after)
        )));
    }
    let MachineAgent { url, client: agent } = ctx.agent_of(view).await?;

    // Resuming: an earlier attempt of this request made a plan. Continue it, or learn that it
    // was applied and only its recording was lost; never refresh the node twice.
    let resumed = match view.annotation(refresh_state::PLAN) {
        Some(plan_id) => match agent.plan_status(&url, plan_id).await {
            Ok(PlanStatus::Applied { outcome }) => {
                let note = format!(
                    "certificates of Machine {} were refreshed by an earlier attempt; they expire at {}",
                    view.name,
                    format_time(outcome.earliest_not_after)
                );
                return Ok(Refreshed::Done {
                    expiry: outcome.earliest_not_after,
                    note,
                });
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
            let plan = agent.plan(&url, &PlanRequest::default()).await?;
            let mut changes = BTreeMap::new();
            changes.insert(refresh_state::PLAN.to_string(), json!(plan.plan_id));
            ctx.patch_annotations(view, changes).await?;
            (plan.plan_id, plan.requests)
        }
    };
    let decisions = identity.signing_plan(&requests).map_err(|refusal| {
        Error::Refused(format!(
            "refused to sign {refusal}; nothing was signed for Machine {}",
            view.name
        ))
    })?;
    let mut certificates = BTreeMap::new();
    for (decision, request) in decisions.iter().zip(&requests) {
        let ca = credentials.authority(decision.ca, &view.namespace, &view.cluster_name)?;
        let signed = ca
            .sign_request(&request.csr_pem, &decision.policy, ttl)
            .map_err(|e| Error::Refused(format!("refused to sign {}: {e}", decision.name)))?;
        certificates.insert(decision.name.clone(), signed.certificate_pem);
    }
    let outcome = agent
        .apply(
            &url,
            &ApplyRequest {
                plan_id,
                certificates,
            },
        )
        .await?;
    let restart = match &outcome.restart {
        None => String::new(),
        Some(hook) if hook.success => "; restart hook succeeded".into(),
        Some(hook) => format!(
            "; the restart hook FAILED (exit code {}, output: {}); the new certificates stay, old ones are backed up in {}",
            hook.exit_code.map_or("none".into(), |c| c.to_string()),
            hook.output_tail,
            outcome.backup_dir.display()
        ),
    };
    let note = format!(
        "refreshed {} certificates of Machine {}; they expire at {}{restart}",
        outcome.applied.len(),
        view.name,
        format_time(outcome.earliest_not_after)
    );
    Ok(Refreshed::Done {
        expiry: outcome.earliest_not_after,
        note,
    })
}

/// Who the Machine is for signing, from the Cluster API objects alone: its node and addresses,
/// its verified role, the Cluster's control-plane endpoint host and the extra SANs of its
/// CK8sControlPlane (any `extraSANs` list in its spec).
async fn machine_identity(ctx: &Context, view: &MachineView) -> Result<MachineIdentity, Error> {
    let node_name = view
        .node_name
        .clone()
        .ok_or_else(|| Error::Invalid(format!("Machine {} has no node", view.name)))?;
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &view.namespace,
        &machine::cluster_api_resource(),
    );
    let cluster = clusters.get_opt(&view.cluster_name).await?;
    let control_plane = cluster.as_ref().and_then(ObjectRef::control_plane_of);
    let role = verified_role(view, control_plane.as_ref())
        .map_err(|e| Error::Refused(format!("refused to refresh: {e}")))?;
    let endpoint_host = cluster.as_ref().and_then(|c| {
        c.data["spec"]["controlPlaneEndpoint"]["host"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_string)
    });
    let mut extra_sans = Vec::new();
    if let Some(reference) = control_plane.filter(|_| role == NodeRole::ControlPlane) {
        let planes: Api<DynamicObject> = Api::namespaced_with(
            ctx.client.clone(),
            &view.namespace,
            &machine::control_plane_api_resource(),
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

fn clear_bookkeeping() -> BTreeMap<String, Value> {
    refresh_state::ALL
        .iter()
        .map(|k| (k.to_string(), Value::Null))
        .collect()
}

fn annotations_failed(trigger: &str, reason: &str) -> BTreeMap<String, Value> {
    let mut changes = clear_bookkeeping();
    changes.insert(
        names::REFRESH_CERTIFICATES_STATUS.into(),
        json!(names::STATUS_FAILED),
    );
    changes.insert(refresh_state::TRIGGER.into(), json!(trigger));
    changes.insert(refresh_state::LAST_ERROR.into(), json!(reason));
    changes
}
