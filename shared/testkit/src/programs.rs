//! External programs a test needs (`redis-server`, `redis-cli`, `rabbitmqctl`, …): whether
//! they run here, and what a test does when one does not.
//!
//! The rule, in one place: under CI (the `CI` environment variable set) a missing program fails
//! the test, naming it, because a CI run that skips a test proves nothing about it; elsewhere
//! the test may skip itself (or fall back to what it can do without), saying so on stderr.

use std::ffi::OsStr;
use std::process::{Command, Stdio};

/// What a test that needs external programs does here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramCheck {
    /// Every program runs: the test runs.
    Run,
    /// One does not run and this is not CI: the test may skip itself, printing this.
    Skip(String),
    /// One does not run under CI: the test fails with this message.
    Fail(String),
}

/// The decision for `test`, given whether this is CI and why a program does not run (`None`:
/// every one runs).
pub fn decide(test: &str, ci: bool, missing: Option<String>) -> ProgramCheck {
    match (missing, ci) {
        (None, _) => ProgramCheck::Run,
        (Some(reason), true) => ProgramCheck::Fail(format!(
            "{test} cannot run: {reason}; CI is set, so a missing program is a failure, not a skip"
        )),
        (Some(reason), false) => ProgramCheck::Skip(format!(
            "skipping {test}: {reason} (CI is not set; under CI this fails)"
        )),
    }
}

/// Whether the value of the `CI` environment variable means CI: set to anything but empty,
/// `0` or `false` (CI services set `true`; `CI=false` opts out by hand).
pub fn ci_flag(value: Option<&OsStr>) -> bool {
    value.is_some_and(|value| {
        let value = value.to_string_lossy();
        let value = value.trim();
        !(value.is_empty() || value == "0" || value.eq_ignore_ascii_case("false"))
    })
}

/// Why the first of `programs` that does not run (`<program> --version` fails to start or
/// exits non-zero) does not; `None` when every one runs.
pub fn missing_program(programs: &[&str]) -> Option<String> {
    programs.iter().find_map(|program| {
        let outcome = Command::new(program)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match outcome {
            Ok(status) if status.success() => None,
            Ok(status) => Some(format!("`{program} --version` exited with {status}")),
            Err(error) => Some(format!("{program} is not runnable: {error}")),
        }
    })
}

/// Whether every one of `programs` runs, for a test that can skip itself (or fall back) without
/// them: `true` and the test runs. Where one does not, under CI this fails the test here, naming
/// it; elsewhere it says so on stderr and returns `false`.
pub fn programs_available(test: &str, programs: &[&str]) -> bool {
    let ci = ci_flag(std::env::var_os("CI").as_deref());
    match decide(test, ci, missing_program(programs)) {
        ProgramCheck::Run => true,
        ProgramCheck::Skip(message) => {
            eprintln!("{message}");
            false
        }
        ProgramCheck::Fail(message) => panic!("{message}"),
    }
}

/// For a helper that cannot skip its caller (it returns a running server): fails the test,
/// naming the program, when one of `programs` does not run, under CI or not.
pub fn require_programs(what: &str, programs: &[&str]) {
    if let Some(reason) = missing_program(programs) {
        panic!("{what} needs {programs:?}: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn a_missing_program_fails_under_ci_and_skips_elsewhere() {
        let missing = || Some("redis-server is not runnable: not found".to_owned());
        let ProgramCheck::Fail(message) = decide("the cluster test", true, missing()) else {
            panic!("under CI a missing program must fail the test");
        };
        assert!(message.contains("the cluster test"), "{message}");
        assert!(message.contains("redis-server"), "{message}");
        let ProgramCheck::Skip(message) = decide("the cluster test", false, missing()) else {
            panic!("outside CI a missing program skips the test");
        };
        assert!(
            message.starts_with("skipping the cluster test"),
            "{message}"
        );
        assert!(message.contains("redis-server"), "{message}");
        assert!(message.contains("CI is not set"), "{message}");
    }

    #[test]
    fn every_program_found_runs_the_test_under_ci_or_not() {
        assert_eq!(decide("a test", true, None), ProgramCheck::Run);
        assert_eq!(decide("a test", false, None), ProgramCheck::Run);
    }

    #[test]
    fn ci_is_any_value_but_empty_0_or_false() {
        let flag = |value: Option<&str>| ci_flag(value.map(OsString::from).as_deref());
        assert!(!flag(None));
        for off in ["", " ", "0", "false", "FALSE"] {
            assert!(!flag(Some(off)), "{off:?}");
        }
        for on in ["true", "1", "yes", "github"] {
            assert!(flag(Some(on)), "{on:?}");
        }
    }

    #[test]
    fn a_program_that_does_not_exist_is_named_as_missing() {
        let reason = missing_program(&["rebate-no-such-program"]).expect("it is missing");
        assert!(reason.contains("rebate-no-such-program"), "{reason}");
    }

    #[test]
    #[should_panic(expected = "needs [\"rebate-no-such-program\"]")]
    fn a_helper_that_cannot_skip_fails_naming_the_program() {
        require_programs("a private server", &["rebate-no-such-program"]);
    }
}
