//! The store's records of data in and out of jobs: replicas' output archives and datasets
//! staged ahead, on every backend (`common`).

mod common;

use common::on_every_backend;

#[tokio::test]
async fn output_archives_are_kept_per_lease_and_a_newer_epochs_replaces_an_older() {
    on_every_backend(|backend, store| async move {
        // Output archives: kept bytes (every byte value, as a tar has), or only a digest.
        let archive: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let kept = store::JobOutputRow {
            lease_id: 7,
            epoch: 1,
            job_id: 40,
            replica: 0,
            digest: "blake3:aa".to_string(),
            size_bytes: archive.len() as i64,
            archive: Some(archive.clone()),
            received_at: 9,
        };
        assert!(store.put_job_output(&kept).await.unwrap(), "{backend}");
        let again = store::JobOutputRow {
            digest: "blake3:bb".to_string(),
            archive: None,
            ..kept.clone()
        };
        assert!(
            !store.put_job_output(&again).await.unwrap(),
            "{backend}: the same epoch's stays"
        );
        let elsewhere = store::JobOutputRow {
            lease_id: 8,
            replica: 1,
            digest: "blake3:cc".to_string(),
            archive: None,
            ..kept.clone()
        };
        assert!(store.put_job_output(&elsewhere).await.unwrap());
        let listed = store.job_outputs(40).await.unwrap();
        assert_eq!(listed.len(), 2, "{backend}");
        assert_eq!((listed[0].digest.as_str(), listed[0].kept), ("blake3:aa", true));
        assert_eq!((listed[1].digest.as_str(), listed[1].kept), ("blake3:cc", false));
        assert_eq!(
            store.job_output_archive(40, 0).await.unwrap(),
            Some(("blake3:aa".to_string(), archive.clone())),
            "{backend}: the bytes as they came"
        );
        assert_eq!(
            store.job_output_archive(40, 1).await.unwrap(),
            None,
            "{backend}: went to its URL"
        );
        let newer = store::JobOutputRow {
            epoch: 2,
            digest: "blake3:dd".to_string(),
            archive: Some(vec![1, 2, 3]),
            size_bytes: 3,
            ..kept
        };
        assert!(
            store.put_job_output(&newer).await.unwrap(),
            "{backend}: a newer epoch's replaces it"
        );
        assert_eq!(
            store.job_output_archive(40, 0).await.unwrap(),
            Some(("blake3:dd".to_string(), vec![1, 2, 3]))
        );
    })
    .await;
}

#[tokio::test]
async fn warm_ups_are_renewed_when_asked_again_and_lapse_at_their_expiry() {
    on_every_backend(|backend, store| async move {
        // Warm-ups: renewed when asked again, lapsed at their expiry.
        let warmup = store::WarmupRow {
            node_id: 3,
            digest: "blake3:ee".to_string(),
            url: "https://data.example.com/e.tar".to_string(),
            size_bytes: 1 << 40,
            tenant_id: 2,
            requested_at: 10,
            expires_at: 100,
        };
        let other = store::WarmupRow {
            node_id: 4,
            digest: "blake3:ff".to_string(),
            expires_at: 50,
            ..warmup.clone()
        };
        store.put_warmups(&[warmup.clone(), other]).await.unwrap();
        assert_eq!(
            store.warmups_of_node(3, 20).await.unwrap(),
            vec![warmup.clone()],
            "{backend}"
        );
        let mut nodes = store.warm_nodes(20).await.unwrap();
        nodes.sort_unstable();
        assert_eq!(nodes, vec![3, 4], "{backend}");
        assert_eq!(
            store.warm_nodes(60).await.unwrap(),
            vec![3],
            "{backend}: node 4's lapsed"
        );
        let renewed = store::WarmupRow {
            expires_at: 200,
            ..warmup
        };
        store.put_warmups(std::slice::from_ref(&renewed)).await.unwrap();
        assert_eq!(store.warmups_of_node(3, 150).await.unwrap(), vec![renewed], "{backend}");
        assert!(
            store.warmups_of_node(3, 200).await.unwrap().is_empty(),
            "{backend}: lapsed"
        );
    })
    .await;
}
