//! What the tracing subscriber writes, kept for a test to search: the operator's logs.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// Everything written by the subscriber of [`Captured::on_this_thread`] or
/// [`Captured::everywhere`].
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Captures what `filter` lets through on this thread until the guard drops (a
    /// `current_thread` test's tasks all run here).
    pub fn on_this_thread(filter: &str) -> (Self, DefaultGuard) {
        let captured = Captured::default();
        let guard = tracing::subscriber::set_default(captured.subscriber(filter));
        (captured, guard)
    }

    /// Captures what `filter` lets through on every thread, for the rest of the test binary.
    pub fn everywhere(filter: &str) -> Self {
        let captured = Captured::default();
        tracing::subscriber::set_global_default(captured.subscriber(filter))
            .expect("no other global subscriber");
        captured
    }

    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    fn subscriber(&self, filter: &str) -> impl tracing::Subscriber + Send + Sync + use<> {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
