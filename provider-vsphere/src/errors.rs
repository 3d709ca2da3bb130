//! vim25 faults (of a call or of a task) as [`machine_core::ErrorKind`]s.
//!
//! A fault is named by its `xsi:type` (or its detail element's name without the `Fault`
//! suffix); subclasses that matter are listed by name, since a SOAP answer names only
//! the most derived type.
//!
//! Limits, decided here:
//! - The `InsufficientResourcesFault` family (`InsufficientMemoryResourcesFault`,
//!   `InsufficientCpuResourcesFault`, `InsufficientHostCapacityFault`,
//!   `InsufficientStorageSpace`, ...), `NotEnoughCpus` and `NoDiskSpace` are
//!   [`ErrorKind::InsufficientCapacity`]: a host, cluster, resource pool or datastore
//!   cannot hold the VM (admission control at power-on, placement at clone). That
//!   includes a resource pool whose limit an administrator set, which vCenter reports
//!   with the same faults as a full host: the provider cannot tell them apart, and
//!   either way another pool, size or a later try may fit, as for EC2's
//!   `InsufficientInstanceCapacity`.
//! - vCenter has no per-account machine quota in vim25; the one account-wide limit
//!   it answers is licensing (`NotEnoughLicenses`), which is
//!   [`ErrorKind::QuotaExceeded`].
//! - vCenter's SOAP API does not throttle with a fault of its own; an overloaded
//!   vCenter answers HTTP 503 from its reverse proxy, which is transient (retried).

use machine_core::{Error, ErrorKind};

/// A SOAP or task fault, as read from the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    /// The fault's type, such as `InvalidPowerState` (empty when the answer named none).
    pub kind: String,
    /// The server's words (`faultstring` or `localizedMessage`).
    pub message: String,
    /// `invalidProperty` of InvalidArgument and its kin: the field that was wrong.
    pub property: Option<String>,
}

impl Fault {
    /// The error of `what` (the call, for the message) that failed with this fault.
    pub fn to_error(&self, what: &str) -> Error {
        let text = if self.message.is_empty() {
            format!("{what}: vSphere fault {}", self.kind)
        } else {
            format!("{what}: vSphere fault {}: {}", self.kind, self.message)
        };
        match kind_of(&self.kind) {
            ErrorKind::InvalidSpec => {
                let field = self
                    .property
                    .clone()
                    .unwrap_or_else(|| match self.kind.as_str() {
                        "InvalidName" => "name".to_owned(),
                        "InvalidDatastore" | "InvalidDatastorePath" => "datastore".to_owned(),
                        _ => "spec".to_owned(),
                    });
                Error::invalid_spec(field, text)
            }
            kind => Error::new(kind, text),
        }
    }
}

/// The kind a fault type maps to.
pub(crate) fn kind_of(fault: &str) -> ErrorKind {
    match fault {
        // A session that expired or was dropped: the client logs in again and a retry
        // succeeds.
        "NotAuthenticated" => ErrorKind::Transient,
        "InvalidLogin" | "NoPermission" | "NotAuthorized" | "NoPermissionOnHost" => {
            ErrorKind::Unauthorized
        }
        "ManagedObjectNotFound" | "NotFound" | "FileNotFound" => ErrorKind::NotFound,
        "InvalidPowerState"
        | "DuplicateName"
        | "InvalidState"
        | "AlreadyExists"
        | "VmConfigIncompatibleForPowerOn" => ErrorKind::Conflict,
        "TaskInProgress" | "ConcurrentAccess" | "HostCommunication" | "HostNotConnected"
        | "HostNotReachable" | "SystemError" | "Timedout" => ErrorKind::Transient,
        "RequestCanceled" => ErrorKind::Cancelled,
        "InvalidArgument"
        | "InvalidProperty"
        | "InvalidRequest"
        | "InvalidName"
        | "InvalidType"
        | "InvalidDatastore"
        | "InvalidDatastorePath"
        | "NotSupported"
        | "InvalidDeviceSpec"
        | "InvalidVmConfig" => ErrorKind::InvalidSpec,
        "NotEnoughLicenses" => ErrorKind::QuotaExceeded,
        "NoDiskSpace" | "NumVirtualCpusExceedsLimit" => ErrorKind::InsufficientCapacity,
        f if f.starts_with("Insufficient") || f.starts_with("NotEnough") => {
            ErrorKind::InsufficientCapacity
        }
        "OutOfBounds" | "MemorySizeNotRecommended" => ErrorKind::InvalidSpec,
        _ => ErrorKind::Permanent,
    }
}

/// A failure reading the answer's body: retried.
pub(crate) fn transport(what: &str, e: &reqwest::Error) -> Error {
    let chain = error_chain(e);
    if e.is_timeout() {
        return Error::timeout(format!("{what}: no answer in time: {chain}"));
    }
    Error::transient(format!("{what}: {chain}"))
}

/// An HTTP status without a SOAP fault in the body.
pub(crate) fn status(what: &str, status: reqwest::StatusCode) -> Error {
    let text = format!("{what}: HTTP {status}");
    match status.as_u16() {
        401 | 403 => Error::new(ErrorKind::Unauthorized, text),
        404 => Error::permanent(format!("{text} (is the URL a vCenter's /sdk?)")),
        429 => Error::throttled(text, None),
        500..=599 => Error::transient(text),
        _ => Error::permanent(text),
    }
}

/// The messages of an error and its sources, joined, for one line of context.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(kind: &str, property: Option<&str>) -> Fault {
        Fault {
            kind: kind.into(),
            message: "m".into(),
            property: property.map(Into::into),
        }
    }

    #[test]
    fn faults_map_to_kinds() {
        let table = [
            ("InvalidPowerState", ErrorKind::Conflict),
            ("DuplicateName", ErrorKind::Conflict),
            ("ManagedObjectNotFound", ErrorKind::NotFound),
            ("NoPermission", ErrorKind::Unauthorized),
            ("InvalidLogin", ErrorKind::Unauthorized),
            ("NotAuthenticated", ErrorKind::Transient),
            ("NoPermissionOnHost", ErrorKind::Unauthorized),
            (
                "InsufficientResourcesFault",
                ErrorKind::InsufficientCapacity,
            ),
            (
                "InsufficientMemoryResourcesFault",
                ErrorKind::InsufficientCapacity,
            ),
            (
                "InsufficientCpuResourcesFault",
                ErrorKind::InsufficientCapacity,
            ),
            (
                "InsufficientHostMemoryCapacityFault",
                ErrorKind::InsufficientCapacity,
            ),
            ("InsufficientStorageSpace", ErrorKind::InsufficientCapacity),
            ("NoDiskSpace", ErrorKind::InsufficientCapacity),
            ("NotEnoughCpus", ErrorKind::InsufficientCapacity),
            (
                "NumVirtualCpusExceedsLimit",
                ErrorKind::InsufficientCapacity,
            ),
            ("NotEnoughLicenses", ErrorKind::QuotaExceeded),
            ("OutOfBounds", ErrorKind::InvalidSpec),
            ("TaskInProgress", ErrorKind::Transient),
            ("RequestCanceled", ErrorKind::Cancelled),
            ("InvalidArgument", ErrorKind::InvalidSpec),
            ("SomethingNew", ErrorKind::Permanent),
        ];
        for (name, kind) in table {
            assert_eq!(fault(name, None).to_error("call").kind(), kind, "{name}");
        }
    }

    #[test]
    fn invalid_argument_names_its_property() {
        let e = fault("InvalidArgument", Some("spec.location.pool")).to_error("CloneVM_Task");
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("spec.location.pool"));
        assert!(e.to_string().contains("InvalidArgument"), "{e}");
        assert_eq!(
            fault("InvalidName", None).to_error("x").field(),
            Some("name")
        );
    }
}
