//! Replicas' output archives (a tar of `$FALLOW_OUTPUT_DIR`): an agent hands the coordinator the
//! archive of a replica whose job gave it no `output_url`, and the tenant reads it back.

use api::{OUTPUT_ARCHIVE_BYTES_MAX, OutputUpload, OutputView};
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use base64::Engine;
use serde::Deserialize;
use store::Role;

use super::agent::node_lease;
use super::{AppStateRef, own_job, require};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, Path, Query, Signed};

/// `POST /v1/agent/leases/{id}/output`: the archive of lease `id`'s replica, kept by the
/// coordinator (at most 16 MiB). Its digest is the coordinator's own reading of the bytes.
pub async fn lease_output(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<OutputUpload>,
) -> ApiResult<Json<OutputView>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let upload = &signed.body;
    if upload.epoch != lease.epoch {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is at epoch {}, not {}",
            lease.epoch, upload.epoch
        )));
    }
    let archive = base64::engine::general_purpose::STANDARD
        .decode(upload.archive_base64.as_bytes())
        .map_err(|error| ApiError::BadRequest(format!("archive_base64: not base64 ({error})")))?;
    if archive.len() > OUTPUT_ARCHIVE_BYTES_MAX {
        return Err(ApiError::TooLarge(format!(
            "an output archive the coordinator keeps is at most {OUTPUT_ARCHIVE_BYTES_MAX} bytes; this one is {}: \
             give the job an output_url",
            archive.len()
        )));
    }
    let view = OutputView {
        digest: format!("blake3:{}", blake3::hash(&archive).to_hex()),
        size_bytes: archive.len() as i64,
        kept: true,
        expired_at_us: None,
    };
    state
        .store
        .put_job_output(&store::JobOutputRow {
            lease_id,
            epoch: upload.epoch,
            job_id: lease.job_id,
            replica: lease.lease.replica,
            digest: view.digest.clone(),
            size_bytes: view.size_bytes,
            archive: Some(archive),
            received_at: state.now_us(),
        })
        .await?;
    Ok(Json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    replica: Option<i64>,
}

/// `GET /v1/jobs/{id}/output?replica=N`: the archive the coordinator keeps of replica N (0 by
/// default) of the caller's job, as `application/x-tar`, its digest in `x-fallow-output-digest`.
pub async fn job_output(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
    Query(query): Query<OutputQuery>,
) -> ApiResult<Response> {
    require(&caller, &[Role::Tenant, Role::Admin])?;
    let job = own_job(&state, &caller, id).await?;
    let replica = query.replica.unwrap_or(0);
    if !(0..i64::from(api::REPLICAS_MAX)).contains(&replica) {
        return Err(ApiError::BadRequest(format!(
            "replica: {replica} is not 0–{}",
            api::REPLICAS_MAX - 1
        )));
    }
    let Some((digest, archive)) = state.store.job_output_archive(job.id, replica).await? else {
        let output_url = crate::wire::job_request(&job).output_url;
        let expired = state
            .store
            .job_outputs(job.id)
            .await?
            .into_iter()
            .rfind(|output| output.replica == replica)
            .and_then(|output| output.expired_at);
        let why = if let Some(at) = expired {
            format!(
                "it was removed at {}, when its retention ({} days) ended",
                model::time::utc(at),
                state.config.output_retention_days
            )
        } else if api::output_url_of(output_url.as_deref(), replica).is_some() {
            "it goes to the job's output_url".to_string()
        } else {
            "it has not ended, or left nothing in $FALLOW_OUTPUT_DIR".to_string()
        };
        return Err(ApiError::NotFound(format!(
            "job {} has no output archive of replica {replica} here: {why}",
            job.id
        )));
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-tar")
        .header(
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"job-{}-replica-{replica}.tar\"", job.id),
        )
        .header("x-fallow-output-digest", digest)
        .body(Body::from(archive))
        .map_err(|error| ApiError::Internal(error.to_string()))
}
