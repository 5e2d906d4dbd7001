//! Submissions written as a batch (`Store::insert_jobs`, the submission writer's group
//! commit): each job gets its own row and id, and a client token used again gives the job first
//! submitted with it, on every backend (`common`).

mod common;

use common::on_every_backend;
use store::{NewJob, Role};

/// A job told apart from the others by its spec, tier and time.
fn job(tenant_id: i64, token: Option<String>, index: usize) -> NewJob {
    NewJob {
        tenant_id,
        client_token: token,
        spec: format!(r#"{{"image":"busybox","index":{index}}}"#),
        tier: if index.is_multiple_of(2) { "silver" } else { "bronze" }.to_string(),
        submitted_at: 1_000 + index as i64,
        reservation_id: None,
    }
}

#[tokio::test]
async fn a_batch_of_submissions_gives_each_job_its_own_row() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "t", 1).await.unwrap();
        let other = store.create_account(Role::Tenant, "u", 1).await.unwrap();
        let earlier = store
            .insert_jobs(&[job(tenant.id, Some("earlier".into()), 0)])
            .await
            .unwrap();
        // Five kinds of job: a new token; the token of the job just before; a token used in an
        // earlier batch; another tenant's job with a token this tenant used; no token.
        let batch: Vec<NewJob> = (0..600)
            .map(|index| match index % 5 {
                0 => job(tenant.id, Some(format!("t{index}")), index),
                1 => job(tenant.id, Some(format!("t{}", index - 1)), index),
                2 => job(tenant.id, Some("earlier".into()), index),
                3 => job(other.id, Some(format!("t{}", index - 3)), index),
                _ => job(tenant.id, None, index),
            })
            .collect();
        let records = store.insert_jobs(&batch).await.unwrap();
        assert_eq!(records.len(), batch.len(), "{backend}");
        for (index, (sent, record)) in batch.iter().zip(&records).enumerate() {
            let stored = store.job(record.id).await.unwrap().expect("the job's row");
            assert_eq!(stored, *record, "{backend}: job {index} comes back as stored");
            match index % 5 {
                1 => assert_eq!(
                    record.id,
                    records[index - 1].id,
                    "{backend}: job {index} repeats a token of this batch: the job first submitted with it"
                ),
                2 => assert_eq!(
                    record.id, earlier[0].id,
                    "{backend}: job {index} repeats a token of an earlier batch"
                ),
                _ => assert_eq!(
                    (
                        stored.tenant_id,
                        &stored.client_token,
                        &stored.spec,
                        &stored.tier,
                        stored.submitted_at
                    ),
                    (
                        sent.tenant_id,
                        &sent.client_token,
                        &sent.spec,
                        &sent.tier,
                        sent.submitted_at
                    ),
                    "{backend}: job {index} has a row of its own"
                ),
            }
        }
        let mut ids: Vec<i64> = records.iter().map(|record| record.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 3 * 600 / 5 + 1, "{backend}: one row per new job");
    })
    .await;
}
