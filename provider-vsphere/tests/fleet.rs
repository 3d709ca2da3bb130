//! A fleet of 50 through the composer with a coupled cloud-init layer, against one
//! vcsim: every machine is made once, carries the layer in guestinfo, is scrubbed once
//! Ready, and the fleet is torn down without leftovers.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, WriteFile};
use machine_core::decorators::Retrying;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, MachineName, MachineProvisioner, RetryPolicy,
};

use common::Vcsim;
use common::admin::Admin;
use common::tools::Tools;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_machines_through_the_composer_with_a_coupled_layer() {
    let vcsim = Vcsim::start();
    // The guests' addresses: a machine runs once its guest reported one.
    let _tools = Tools::start(&vcsim).await;
    let admin = Admin::login(&vcsim).await;
    let provider = Arc::new(common::provider(&vcsim, &common::owner("fleet")));
    let layer = CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_file(WriteFile::new("/etc/motd", "from the fleet test\n"))
            .with_runcmd("echo fleet-marker > /var/tmp/fleet"),
    )
    .expect("layer");
    let composer = Composer::builder(Arc::new(Retrying::new(
        provider.clone(),
        RetryPolicy::default(),
    )))
    .coupled(Arc::new(layer))
    .settings(ComposerSettings::default().with_poll_interval(Duration::from_millis(50)))
    .build()
    .expect("composer");
    let names: Vec<MachineName> = (0..50)
        .map(|i| MachineName::new(format!("fleet-{i:02}")).unwrap())
        .collect();
    let specs: Vec<_> = names.iter().map(common::spec).collect();
    let cancel = CancellationToken::new();
    let results = composer
        .provision_fleet(&specs, NonZeroUsize::new(8).unwrap(), &cancel)
        .await
        .expect("fleet");
    assert_eq!(results.len(), 50);
    for r in &results {
        let done = r
            .outcome
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: {e}", r.name));
        let ud = provider
            .user_data(&done.machine.provider_id)
            .await
            .expect("user_data")
            .expect("user data delivered");
        let text = String::from_utf8(ud.decoded().unwrap()).unwrap();
        assert!(text.contains("fleet-marker"), "{}: layer missing", r.name);
        // No completion check can pass on vcsim (no guest runs cloud-init), so the
        // composer never saw the bootstrap end and left the user data: say it here.
        provider
            .bootstrap_finished(&done.machine)
            .await
            .expect("scrub");
        assert!(
            provider
                .user_data(&done.machine.provider_id)
                .await
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(admin.count_named("fleet-07").await, 1);
    for (name, r) in composer
        .deprovision_fleet(&names, NonZeroUsize::new(8).unwrap(), &cancel)
        .await
    {
        r.unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let left = provider.list(&Default::default()).await.unwrap();
    assert!(left.is_empty(), "{left:#?}");
    assert_eq!(admin.count_named("fleet-07").await, 0);
}
