//! Idempotency without ClientToken (moto ignores it): a create after a simulated crash
//! adopts the machine by its tags, and DescribeInstances is followed past moto's pages.

mod common;

use machine_core::{Labels, MachineProvisioner, Phase};

use common::Moto;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_provider_adopts_after_a_crash() {
    let moto = Moto::start();
    let owner = common::owner("adopt");
    let spec = common::spec("adopt-1").with_label("role", "db");

    let first = common::provider(&moto.endpoint, &owner).await;
    let made = first.create(&spec, None).await.unwrap();
    // The process dies: nothing of `first` survives but what EC2 keeps.
    drop(first);

    let second = common::provider(&moto.endpoint, &owner).await;
    let found = second
        .find(&spec.name)
        .await
        .unwrap()
        .expect("found by name");
    assert_eq!(found.provider_id, made.provider_id);
    let again = second.create(&spec, None).await.unwrap();
    assert_eq!(
        again.provider_id, made.provider_id,
        "a second instance was launched"
    );
    assert_eq!(second.owned_instances().await.unwrap().len(), 1);

    // Another owner never sees, adopts or deletes it.
    let stranger = common::provider(&moto.endpoint, &common::owner("stranger")).await;
    assert!(stranger.find(&spec.name).await.unwrap().is_none());
    let theirs = stranger.create(&spec, None).await.unwrap();
    assert_ne!(theirs.provider_id, made.provider_id);
    let e = stranger.delete(&made.provider_id).await.unwrap_err();
    assert_eq!(e.kind(), machine_core::ErrorKind::Conflict, "{e}");
    let e = stranger.get(&made.provider_id).await.unwrap_err();
    assert_eq!(e.kind(), machine_core::ErrorKind::NotFound, "{e}");
    assert_eq!(
        second.get(&made.provider_id).await.unwrap().phase,
        Phase::Provisioned
    );

    // Once terminated, the name is free again: a new instance, not the dead one.
    second.delete(&made.provider_id).await.unwrap();
    assert_eq!(
        second.get(&made.provider_id).await.unwrap().phase,
        Phase::Deleted
    );
    assert!(second.find(&spec.name).await.unwrap().is_none());
    let reborn = second.create(&spec, None).await.unwrap();
    assert_ne!(reborn.provider_id, made.provider_id);
    assert_eq!(
        second
            .list(&Labels::from([("role".into(), "db".into())]))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_next_token_past_150_instances() {
    let moto = Moto::start();
    let owner = common::owner("pages");
    let p = std::sync::Arc::new(common::provider(&moto.endpoint, &owner).await);
    let count = 160;
    // Sixteen creates at a time: this test is about paging, and a 160-way burst queues
    // RunInstances behind moto's single process past the 20 s attempt timeout on a
    // loaded CI machine (each create also makes a tag-filtered lookup after launching,
    // to settle races).
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        let p = p.clone();
        let slots = slots.clone();
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.expect("semaphore open");
            let spec = common::spec(&format!("page-{i:03}")).with_label("batch", "pages");
            p.create(&spec, None).await.map(|m| m.provider_id)
        });
    }
    let mut ids = Vec::new();
    while let Some(r) = tasks.join_next().await {
        ids.push(r.unwrap().unwrap());
    }
    assert_eq!(ids.len(), count);

    let listed = p
        .list(&Labels::from([("batch".into(), "pages".into())]))
        .await
        .unwrap();
    assert_eq!(listed.len(), count, "list stopped at a page boundary");
    let names: Vec<_> = listed.iter().map(|m| m.name.as_str().to_owned()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "list is in name order");
    assert_eq!(names.first().map(String::as_str), Some("page-000"));
    assert_eq!(names.last().map(String::as_str), Some("page-159"));
    // The raw listing pages too (moto answers 100 per page).
    assert_eq!(p.owned_instances().await.unwrap().len(), count);
    // A name on the last page is found and adopted, not duplicated.
    let last = common::spec("page-159").with_label("batch", "pages");
    let again = p.create(&last, None).await.unwrap();
    assert!(ids.contains(&again.provider_id));
    assert_eq!(p.owned_instances().await.unwrap().len(), count);
}
