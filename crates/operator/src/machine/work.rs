//! The work a Machine controller pass starts in the background: the calls to the node that
//! carry out a refresh ([`refresh`]) or an upgrade ([`upgrade`]), each recording its end on
//! the Machine.

pub mod refresh;
pub mod upgrade;
