//! Admin and key endpoints: accounts, API keys (create, list, revoke, rotate), credits, and
//! the evidence log.

use api::*;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use model::Micros;
use store::Role;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path, Query};
use crate::money;
use crate::state::AppState;

use super::billing::{AccountQuery, balance};
use super::{AppStateRef, check_name, require};

fn account_view(account: &store::AccountRecord) -> AccountView {
    AccountView {
        id: account.id,
        role: account.role.as_str().to_string(),
        name: account.name.clone(),
        created_at_us: account.created_at,
    }
}

/// Makes an API key for an account and stores its hash; the key itself is returned once.
pub async fn issue_key(state: &AppState, account_id: i64, label: &str) -> ApiResult<NewKeyResponse> {
    let key = trust::generate_api_key();
    state
        .store
        .insert_api_key(&store::ApiKeyRecord {
            key_id: key.key_id.clone(),
            account_id,
            secret_hash: key.secret_hash.clone(),
            label: label.to_string(),
            created_at: state.now_us(),
            revoked_at: None,
        })
        .await?;
    Ok(NewKeyResponse {
        key_id: key.key_id,
        api_key: key.display,
    })
}

pub async fn create_account(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<NewAccountRequest>,
) -> ApiResult<(StatusCode, Json<NewAccountResponse>)> {
    require(&caller, &[Role::Admin])?;
    let role = Role::parse(&request.role)
        .ok_or_else(|| ApiError::BadRequest(format!("role: {:?} is not tenant, provider or admin", request.role)))?;
    check_name("name", &request.name, true)?;
    let account = state.store.create_account(role, &request.name, state.now_us()).await?;
    let api_key = issue_key(&state, account.id, "first key").await?;
    Ok((
        StatusCode::CREATED,
        Json(NewAccountResponse {
            account: account_view(&account),
            api_key,
        }),
    ))
}

pub async fn list_accounts(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<Vec<AccountView>>> {
    require(&caller, &[Role::Admin])?;
    Ok(Json(state.store.accounts().await?.iter().map(account_view).collect()))
}

pub async fn create_key(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(account_id): Path<i64>,
    JsonBody(request): JsonBody<NewKeyRequest>,
) -> ApiResult<(StatusCode, Json<NewKeyResponse>)> {
    if caller.role != Role::Admin && caller.account_id != account_id {
        return Err(ApiError::NotFound(format!("account {account_id} not found")));
    }
    check_name("label", &request.label, false)?;
    if state.store.account(account_id).await?.is_none() {
        return Err(ApiError::NotFound(format!("account {account_id} not found")));
    }
    Ok((
        StatusCode::CREATED,
        Json(issue_key(&state, account_id, &request.label).await?),
    ))
}

pub async fn list_keys(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(account_id): Path<i64>,
) -> ApiResult<Json<Vec<KeyView>>> {
    if caller.role != Role::Admin && caller.account_id != account_id {
        return Err(ApiError::NotFound(format!("account {account_id} not found")));
    }
    let keys = state.store.api_keys_of(account_id).await?;
    Ok(Json(
        keys.into_iter()
            .map(|key| KeyView {
                key_id: key.key_id,
                account_id: key.account_id,
                label: key.label,
                created_at_us: key.created_at,
                revoked_at_us: key.revoked_at,
            })
            .collect(),
    ))
}

pub async fn revoke_key(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(key_id): Path<String>,
) -> ApiResult<StatusCode> {
    let key = state.store.api_key(&key_id).await?;
    match key {
        Some(key) if caller.role == Role::Admin || key.account_id == caller.account_id => {
            if !state.store.revoke_api_key(&key_id, state.now_us()).await? {
                return Err(ApiError::Conflict(format!("key {key_id} is already revoked")));
            }
            state.forget_key(&key_id);
            Ok(StatusCode::NO_CONTENT)
        }
        _ => Err(ApiError::NotFound(format!("key {key_id} not found"))),
    }
}

/// Rotation: a new key for the caller's account, and the key used for this request revoked.
pub async fn rotate_key(
    State(state): AppStateRef,
    headers: axum::http::HeaderMap,
    Auth(caller): Auth,
) -> ApiResult<(StatusCode, Json<NewKeyResponse>)> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    let (old_id, _) =
        trust::parse_api_key(presented.trim()).map_err(|error| ApiError::Unauthorized(error.to_string()))?;
    let old_id = old_id.to_string();
    let fresh = issue_key(&state, caller.account_id, "rotated").await?;
    state.store.revoke_api_key(&old_id, state.now_us()).await?;
    state.forget_key(&old_id);
    Ok((StatusCode::CREATED, Json(fresh)))
}

pub async fn credit(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<CreditRequest>,
) -> ApiResult<Json<BalanceView>> {
    require(&caller, &[Role::Admin])?;
    let account = state
        .store
        .account(request.account_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("account {} not found", request.account_id)))?;
    if account.role != Role::Tenant {
        return Err(ApiError::NotFound(format!(
            "tenant {0} not found: account {0} is a {1} account, and credit is for tenants",
            account.id, account.role
        )));
    }
    let amount = Micros::parse_dollars(&request.amount)
        .filter(|amount| amount.0 > 0 && amount.0 <= 10_000_000 * Micros::PER_DOLLAR)
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "amount: {:?} is not 0.000001–10,000,000 dollars",
                request.amount
            ))
        })?;
    check_name("key", &request.key, true)?;
    let transaction = ledger::deposit(account.id, amount, format!("deposit:{}", request.key), state.now_us())
        .map_err(money::ledger_error)?;
    money::apply(&state.store, &transaction).await?;
    balance(
        State(state.clone()),
        Auth(caller),
        Query(AccountQuery {
            account_id: Some(account.id),
        }),
    )
    .await
}

pub async fn evidence(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<Vec<EvidenceView>>> {
    require(&caller, &[Role::Admin])?;
    let rows = state.store.evidence(None, 1000).await?;
    Ok(Json(
        rows.into_iter()
            .map(|row| EvidenceView {
                id: row.id,
                node_id: row.node_id,
                kind: row.kind,
                detail: row.detail,
                at_us: row.at,
            })
            .collect(),
    ))
}
