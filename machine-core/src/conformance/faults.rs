//! Faults put between a provider and its backend, and the case that checks each comes
//! back with its kind.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::decorators::Retrying;
use crate::error::ErrorKind;
use crate::provisioner::MachineProvisioner;
use crate::retry::RetryPolicy;

use super::fixture::{Clients, Fixture};

/// An answer a backend gives when it refuses work, as the suite asks a [`FaultHook`] to
/// give it. `#[non_exhaustive]`: faults may be added as the contract grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendFault {
    /// The account's limit (EC2's `InstanceLimitExceeded`, a vCenter quota): must come
    /// back as [`ErrorKind::QuotaExceeded`] and never be retried.
    Quota,
    /// The place has no room (EC2's `InsufficientInstanceCapacity`): must come back as
    /// [`ErrorKind::InsufficientCapacity`].
    Capacity,
    /// The credentials lack a permission (EC2's `UnauthorizedOperation`, HTTP 403): must
    /// come back as [`ErrorKind::Unauthorized`].
    Permission,
    /// Slow down (EC2's `RequestLimitExceeded`, HTTP 429 or 503 with `Retry-After`): must
    /// come back as [`ErrorKind::Throttled`].
    Throttle,
}

impl BackendFault {
    /// Every fault, in the order the suite tries them.
    pub const ALL: [BackendFault; 4] = [
        BackendFault::Quota,
        BackendFault::Capacity,
        BackendFault::Permission,
        BackendFault::Throttle,
    ];

    /// The kind a provider must report for this fault.
    pub fn kind(self) -> ErrorKind {
        match self {
            BackendFault::Quota => ErrorKind::QuotaExceeded,
            BackendFault::Capacity => ErrorKind::InsufficientCapacity,
            BackendFault::Permission => ErrorKind::Unauthorized,
            BackendFault::Throttle => ErrorKind::Throttled,
        }
    }
}

impl fmt::Display for BackendFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Makes a provider's backend refuse work, on the wire, the way the real backend
/// refuses it: a proxy in front of the peer that answers with the backend's own error
/// document, or the simulator's switch. The suite uses it to check the provider's
/// mapping of those answers, not a decorator's.
#[async_trait]
pub trait FaultHook: Send + Sync {
    /// Whether the backend has an answer for `fault` (a BMC has no account quota).
    fn supports(&self, fault: BackendFault) -> bool;

    /// From now until [`FaultHook::clear`], requests that the backend would refuse this
    /// way are answered with `fault`: at least the request a create makes to launch the
    /// machine; which others is the hook's choice, as the real backend would choose.
    /// Resets [`FaultHook::answered`].
    async fn inject(&self, fault: BackendFault);

    /// Stops answering with faults.
    async fn clear(&self);

    /// How many requests were answered with the injected fault since the last inject.
    fn answered(&self) -> u64;
}

/// Each fault the fixture's hook supports comes back from `create` with its kind, and no
/// machine is made; quota is answered once, never retried, bare or through
/// [`Retrying`]. A fixture without a hook passes without a machine.
pub async fn backend_faults_come_back_with_their_kind(c: &Clients, fx: &Fixture) {
    let Some(hook) = fx.faults.clone() else {
        return;
    };
    let p = c.provider.clone();
    let retrying: Arc<dyn MachineProvisioner> = Arc::new(Retrying::new(
        p.clone(),
        RetryPolicy::default()
            .with_max_retries(3)
            .with_initial_delay(Duration::from_millis(1))
            .with_max_delay(Duration::from_millis(5)),
    ));
    for fault in BackendFault::ALL {
        if !hook.supports(fault) {
            continue;
        }
        for (how, client) in [("bare", &p), ("through Retrying", &retrying)] {
            let spec = fx.spec(&format!("fault-{}", fault.to_string().to_lowercase()));
            hook.inject(fault).await;
            let created = client.create(&spec, None).await;
            let answered = hook.answered();
            hook.clear().await;
            match created {
                Ok(m) => {
                    fx.cleanup(p.as_ref(), &m).await;
                    panic!("{p}: create succeeded ({how}) while the backend answered {fault}");
                }
                Err(e) => assert_eq!(
                    e.kind(),
                    fault.kind(),
                    "{p}: the backend's {fault} answer came back ({how}) as another kind: {e}"
                ),
            }
            assert!(
                answered >= 1,
                "{p}: the fault hook answered no request with {fault}: the hook is broken"
            );
            if fault == BackendFault::Quota {
                assert_eq!(
                    answered, 1,
                    "{p}: a quota answer was retried ({how}): {answered} requests answered with it"
                );
            }
            super::assert_not_created(
                p.as_ref(),
                &spec.name,
                &format!("a machine was left by a create refused with {fault}"),
            )
            .await;
        }
    }
}
