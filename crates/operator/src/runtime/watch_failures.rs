//! Watch failures, told without flooding the log: a watcher retries with backoff, and a user
//! needs to hear once that it fails and once that it works again.

use futures::{Stream, StreamExt, future};
use kube::runtime::watcher;

/// Says once that a watch fails, and once that it works again; retries in between are quiet.
pub(crate) struct Failing {
    /// Whose watch, at the head of each message.
    who: &'static str,
    /// Of what kind.
    what: String,
    reported: bool,
}

impl Failing {
    pub(crate) fn new(who: &'static str, what: impl Into<String>) -> Self {
        Self {
            who,
            what: what.into(),
            reported: false,
        }
    }

    pub(crate) fn failed(&mut self, error: &watcher::Error) {
        if self.reported {
            tracing::debug!(watch = %self.what, error = %error, "{}: watch still failing", self.who);
        } else {
            tracing::warn!(watch = %self.what, error = %error, "{}: cannot watch; retrying quietly until it works", self.who);
            self.reported = true;
        }
    }

    pub(crate) fn recovered(&mut self) {
        if self.reported {
            tracing::info!(watch = %self.what, "{}: the watch works again", self.who);
            self.reported = false;
        }
    }

    /// The events of a watch with its failures told here (once, and once the recovery)
    /// instead of passed on.
    pub(crate) fn events<T>(
        mut self,
        events: impl Stream<Item = Result<T, watcher::Error>>,
    ) -> impl Stream<Item = T> {
        events.filter_map(move |event| {
            future::ready(match event {
                Ok(event) => {
                    self.recovered();
                    Some(event)
                }
                Err(e) => {
                    self.failed(&e);
                    None
                }
            })
        })
    }
}
