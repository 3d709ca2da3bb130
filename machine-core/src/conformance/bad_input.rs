//! A corpus check for parsers and validators: every bad input of a table is refused as
//! an invalid spec naming the expected field (and document line), without a panic, in
//! bounded time, with a bounded message. Providers and layers run their own tables
//! through [`check_bad_inputs`], so that every crate holds its errors to one standard.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::error::{ErrorKind, Result};

/// The most CPU time one case may use: a guard against inputs that make a parser blow up
/// (deep nesting, alias bombs), generous for a debug build. It bounds work, not wall
/// time: a case that waits for a busy machine's CPU is not charged for the wait (see
/// [`cpu_time`]).
pub const CASE_TIME: Duration = Duration::from_millis(750);

/// Runs `f` on this thread and returns its result with the CPU time the thread used
/// meanwhile, read from Linux's `/proc/thread-self/schedstat` (nanoseconds on the CPU).
/// Where that cannot be read, the wall time divided by ten, so that a bound on it still
/// holds on a machine ten times slower. For tests that bound work rather than wall time.
pub fn cpu_time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let before = thread_cpu();
    let wall = Instant::now();
    let out = f();
    let used = match (before, thread_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => wall.elapsed() / 10,
    };
    (out, used)
}

fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

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
/// panicked, used more CPU time than [`CASE_TIME`], gave another kind than
/// [`ErrorKind::InvalidSpec`], named another field, lacked its line or gave a message
/// over [`MAX_MESSAGE`] bytes.
pub fn check_bad_inputs<I>(cases: &[BadInput<I>], run: impl Fn(&I) -> Result<()>) {
    let mut failures = Vec::new();
    for case in cases {
        let (outcome, took) = cpu_time(|| catch_unwind(AssertUnwindSafe(|| run(&case.input))));
        let mut fail = |why: String| failures.push(format!("{}: {why}", case.name));
        if took > CASE_TIME {
            fail(format!("used {took:?} of CPU"));
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
    fn cpu_time_counts_work_not_waiting() {
        let ((), slept) = cpu_time(|| std::thread::sleep(Duration::from_millis(200)));
        assert!(
            slept < Duration::from_millis(100),
            "sleeping cost {slept:?}"
        );
        let (_, spun) = cpu_time(|| {
            let until = Instant::now() + Duration::from_millis(200);
            let mut n = 0u64;
            while Instant::now() < until {
                n = std::hint::black_box(n + 1);
            }
            n
        });
        // At least some of the 200 ms of spinning was on the CPU, even on a busy machine.
        assert!(spun > Duration::from_millis(5), "spinning cost {spun:?}");
    }

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
