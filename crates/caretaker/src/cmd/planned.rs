//! Subcommands that are designed but not built yet. They exist so that `caretaker --help`
//! shows the whole tool, and they say plainly that they do nothing yet.

use std::process::ExitCode;

/// Accepts no options: the command is not built yet.
#[derive(Debug, clap::Args)]
pub struct PlannedArgs {}

pub const CRDS: &str = "Print the CustomResourceDefinitions caretaker serves, generated \
from its Rust types.\n\nNot built yet: this command exits with status 2.";

pub fn not_built(name: &str) -> ExitCode {
    super::run(name, || {
        Err(super::Failure::from(format!(
            "not built yet; `caretaker {name} --help` says what it will do and the README \
             lists what works today"
        ))
        .with_code(2))
    })
}
