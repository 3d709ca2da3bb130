//! A corpus check for parsers and validators: every bad input of a table is refused as
//! an invalid spec naming the expected field (and document line), without a panic, in
//! bounded time, with a bounded message. Providers and layers run their own tables
//! through [`check_bad_inputs`], so that every crate holds its errors to one standard.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::error::{ErrorKind, Result};

/// The longest time one case may take: a guard against inputs that make a parser
/// blow up (deep nesting, alias bombs), generous for a debug build on a loaded machine.
pub const CASE_TIME: Duration = Duration::from_millis(750);

/// The longest error message a case may give: echoed values must be cut.
pub const MAX_MESSAGE: usize = 1_000;

/// One bad input and where its error must point.
#[derive(Debug, Clone)]
pub struct BadInput<I> {
    /// What the case is, shown when it fails.
    pub name: &'static str,
    /// What is fed to the parser.
    pub input: I,
    /// The field path the error must name; `None` for an error of the whole document.
    pub field: Option<String>,
    /// The document line the message must give, where there is one.
    pub line: Option<u32>,
}

impl<I> BadInput<I> {
    /// A case whose error names `field` (`""`: the whole document's error) and, when
    /// given, `line`.
    pub fn new(name: &'static str, input: I, field: &str, line: Option<u32>) -> Self {
        BadInput {
            name,
            input,
            field: (!field.is_empty()).then(|| field.to_owned()),
            line,
        }
    }
}

/// Runs every case through `run` and panics listing every case that was accepted,
/// panicked, took longer than [`CASE_TIME`], gave another kind than
/// [`ErrorKind::InvalidSpec`], named another field, lacked its line or gave a message
/// over [`MAX_MESSAGE`] bytes.
pub fn check_bad_inputs<I>(cases: &[BadInput<I>], run: impl Fn(&I) -> Result<()>) {
    let mut failures = Vec::new();
    for case in cases {
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&case.input)));
        let took = started.elapsed();
        let mut fail = |why: String| failures.push(format!("{}: {why}", case.name));
        if took > CASE_TIME {
            fail(format!("took {took:?}"));
        }
        let e = match outcome {
            Err(_) => {
                fail("panicked".to_owned());
                continue;
            }
            Ok(Ok(())) => {
                fail("was accepted".to_owned());
                continue;
            }
            Ok(Err(e)) => e,
        };
        let shown = e.to_string();
        if e.kind() != ErrorKind::InvalidSpec {
            fail(format!("kind {:?}: {shown}", e.kind()));
        }
        if e.field() != case.field.as_deref() {
            fail(format!("field {:?}: {shown}", e.field()));
        }
        if let Some(line) = case.line
            && !shown.contains(&format!("line {line}"))
        {
            fail(format!("no line {line}: {shown}"));
        }
        if shown.len() > MAX_MESSAGE {
            let cut: String = shown.chars().take(200).collect();
            fail(format!("message of {} bytes: {cut}", shown.len()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs were not refused as they should be:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn a_correct_refusal_passes() {
        let cases = [BadInput::new("bad port", "x", "port", None)];
        check_bad_inputs(&cases, |_| Err(Error::invalid_spec("port", "not a number")));
    }

    #[test]
    #[should_panic(expected = "wrong field: field Some(\"host\")")]
    fn a_refusal_naming_another_field_fails() {
        let cases = [BadInput::new("wrong field", "x", "port", None)];
        check_bad_inputs(&cases, |_| Err(Error::invalid_spec("host", "bad")));
    }

    #[test]
    #[should_panic(expected = "accepted: was accepted")]
    fn an_accepted_input_fails() {
        let cases = [BadInput::new("accepted", "x", "", None)];
        check_bad_inputs(&cases, |_| Ok(()));
    }
}
