//! `machines`: an operator's command over a fleet file, on the built-in simulator by
//! default. See the crate README for the fleet file's format, the commands and their
//! exit codes.
//!
//! - `plan`: what an apply would change, machine by machine and why: which machines are
//!   updated in place (a decoupled layer changed), which are replaced (a coupled layer or
//!   a spec field changed: named), created or deleted; exit 0 when nothing is to do, 2
//!   when something is.
//! - `apply`: drives machine-core's fleet reconciler step by step to convergence, with
//!   progress bars; Ctrl-C stops between steps and a rerun carries on.
//! - `status`: the set and every machine (`--output json` for programs).
//! - `destroy`: scales the set to zero through the reconciler until nothing is left.
//!
//! The library half is what the binary is made of, public so that its tests reach it.

pub mod commands;
pub mod file;
pub mod fleet;
pub mod state;
pub mod ui;

pub use commands::{Exit, Output};
pub use file::FleetFile;
pub use fleet::Fleet;
