//! A pass that acts on nothing (a spec that does not validate, an object that is another's,
//! a namespace it may not use): the object's status says why (Ready false, Degraded with the
//! reason), and a Warning event says it once per problem, after the status or with it, so that
//! whoever reads the Warning finds the status it speaks of. Each controller says how its kind
//! shows this ([`ShowRefusal`]); the sequence is [`refuse`]'s.

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use crate::Error;
use crate::changes::Event;

/// Why a pass acts on nothing: the Degraded condition's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

/// How a controller shows that a pass refused one of its objects (`K`).
pub(crate) trait ShowRefusal<K> {
    /// What was last said to be wrong with `object`: the Degraded message its last pass in
    /// this process gave it, else the one in the status it was read with.
    fn reported(&self, object: &K) -> Option<String>;

    /// Writes `object`'s status saying `refusal`, then publishes `warning` (or leaves both to
    /// be written in that order), and remembers what the status says.
    async fn show(
        &self,
        object: &K,
        refusal: &Refusal,
        warning: Option<Event>,
    ) -> Result<(), Error>;
}

/// Refuses `object` for `reason` (`message`): nothing is written but its status, which says
/// why, and a Warning unless the status already says the same.
pub(crate) async fn refuse<K, C>(
    controller: &C,
    object: &K,
    reason: &'static str,
    message: String,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
    C: ShowRefusal<K>,
{
    let refusal = Refusal { reason, message };
    let warning =
        (controller.reported(object).as_deref() != Some(refusal.message.as_str())).then(|| {
            let kind = K::kind(&());
            let name = object.name_any();
            tracing::warn!(%kind, %name, reason, message = %refusal.message, "{kind} not acted on");
            Event::warning(reason, refusal.message.clone())
        });
    controller.show(object, &refusal, warning).await?;
    Ok(Action::await_change())
}
