//! What the tests of the `caretaker` binary share: running it and reading what it said.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The `caretaker` binary these tests were built with, as a command to add arguments to.
pub fn caretaker_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_caretaker"))
}

/// Runs `caretaker ARGS` to its end.
pub fn caretaker(args: &[&str]) -> Output {
    caretaker_command()
        .args(args)
        .output()
        .expect("run caretaker")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `p` as an argument.
pub fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A command that failed as bad input must: a non-zero exit status and exactly one line on
/// stderr, which names `named`. Returns that line.
pub fn assert_one_error_line(output: &Output, named: &str) -> String {
    let err = stderr(output);
    assert!(
        !output.status.success(),
        "it should have failed; stderr: {err}"
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected, got: {err}"
    );
    assert!(err.contains(named), "{err:?} should name {named:?}");
    err
}
